"""An error's text with the engine's internal classes named as the learner knows them.

The Scheduler is built from mixins, one a chapter (SpeculativeSteps, GrammarSteps, ...), so a
TypeError from a method the learner calls through `self` names the mixin that defines it:
"SpeculativeSteps._process_last_data() missing 1 required positional argument", a class of
chapter 24 in a chapter-7 message. The learner calls the method on the scheduler, so the message
names the scheduler. Used by the try-outs (tryout.py) and the judge's failure messages.
"""

from __future__ import annotations

import re
import sys

_QUALNAME = re.compile(r"\b([A-Z]\w*)\.(\w+)\(\)")


def in_learner_terms(text: str) -> str:
    """`text` with `Mixin.method()` written `Scheduler.method()` for each class the Scheduler is
    built from (only when the scheduler's module is loaded: nothing is imported to say this)."""
    module = sys.modules.get("minisgl.scheduler.scheduler")
    scheduler = getattr(module, "Scheduler", None)
    if scheduler is None:
        return text
    mixins = {c.__name__ for c in scheduler.__mro__[1:] if c is not object}
    return _QUALNAME.sub(
        lambda m: f"Scheduler.{m.group(2)}()" if m.group(1) in mixins else m.group(0), text
    )
