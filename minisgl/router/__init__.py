"""A cache-aware router in front of several servers (`python -m minisgl router`).

A radix cache helps only the requests that reach the instance holding their prefix. Behind a
round-robin balancer a tenant's requests scatter, and every instance computes the same long
system prompt. The router keeps, per worker, an approximate prefix tree of what it sent there
(tree.py), sends a request where the longest prefix of it went unless the load is out of balance
(policy.py, SGLang's rule), watches the workers' health (workers.py), and passes the OpenAI API
through unchanged (app.py, keys.py). serve.py starts it. SGLang's own router (`sglang-router`,
the `[router]` extra) runs in front of the same workers the same way.
"""
