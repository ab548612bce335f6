"""Upstream's `check_integrity`: it only checks that free and cached pages add up to the pool.

A page freed twice and a page leaked cancel out in the count; a page both free and cached, a lock
left behind with no request running, and a prefix tree whose own books are wrong all go unnoticed.
"""


def check_integrity(self):
    cached_pages = torch.unique(self.prefix_cache.all_indices() // self.page_size)
    n_free, n_cached = len(self.free_pages), len(cached_pages)
    assert n_free + n_cached == self.num_pages, (
        f"free_pages({n_free}) + cache_pages({n_cached}) != num_pages({self.num_pages})"
    )
