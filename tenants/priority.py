"""Priority classes and fairness weights as the control plane holds them, in the engine's own terms
(engine.fair_share, torch-free): `interactive` requests are admitted before `batch` ones, and a tenant's weight
scales its share of service while several are backlogged.

A tenant's class is a quota field, so it is stored and audited as an integer code (QuotaChange keeps integers, and
one audited path for every operator-set limit beats a second one for one text field); the codes are pinned here,
not taken from the engine's order, so that a class added to the engine never changes what a stored code means.
The API, the console and `set_quota` speak the names.
"""

from engine.fair_share import MAX_WEIGHT, PRIORITIES

INTERACTIVE, BATCH = "interactive", "batch"
PRIORITY_CODES = {INTERACTIVE: 1, BATCH: 2}
PRIORITY_NAMES = {code: name for name, code in PRIORITY_CODES.items()}
PRIORITY_CHOICES = [(INTERACTIVE, "Interactive"), (BATCH, "Batch")]
MAX_FAIRNESS_WEIGHT = int(MAX_WEIGHT)

if set(PRIORITY_CODES) != set(PRIORITIES):  # the engine refuses a class it does not know
    raise ImportError(f"tenants.priority knows {sorted(PRIORITY_CODES)}, the engine {sorted(PRIORITIES)}")


def priority_code(name: str) -> int:
    """The stored code of a class name; ValueError for an unknown one."""
    if name not in PRIORITY_CODES:
        raise ValueError(f"priority class must be one of {', '.join(PRIORITY_CODES)}, got {name!r}")
    return PRIORITY_CODES[name]


def priority_name(code: int) -> str:
    return PRIORITY_NAMES[code]


def effective_priority(*classes: str) -> str:
    """A request is batch when its tenant's class or its key says so: a key cannot lift a batch tenant."""
    return BATCH if BATCH in classes else INTERACTIVE
