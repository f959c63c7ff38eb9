"""Which GEMM path each projection of the model runs at each band of token counts: measured once per machine at
start-up, cached on disk, bound to every ``Projection``.

Each distinct projection (q|k|v, o, gate|up, down, the vocabulary) is timed on every path its weights' format has
(``engine.models.gemm``: float weights on ``torch``/``onednn``/``gemv``/``packed``, int8 ones on ``w8a16``, ``w8a8g``
(VNNI or AVX2 CPUs), ``dequantized`` and, in the projections ``quant.allows_w8a8`` names, ``w8a8``) at M = 1, 2, 4, ...
up to the most rows a step gives it (``max_num_batched_tokens``; for the vocabulary ``max_num_seqs``, as it only sees
the sampled rows). The calls cycle through that projection's weights in every layer, so small M mostly reads them from
memory as a step does, not from a warm cache; up to 16 rows a path's time is the mean of a whole cycle, each path on
another layer than the others (the fastest single call there was one whose weight the cache still held); a count where
some path reads well below both neighbouring counts is timed once more (a burst of other work over its few calls
would be cached for good). Band
``(M/2, M]`` takes the fastest path at M, unless the path that wins most bands for the shape is within ``_MARGIN``
there: a second path for a shape costs a second copy of its weights. Where the C replay of the decoder layers runs
(``engine.models.native_forward``), a step it cannot take pays Python between the kernels: a layer projection whose
fastest path at some M is not a C kernel moves to its fastest C one when that costs the step's GEMMs less than the
replay saves (``_replayable``; applied at each start, so the cache keeps the measured choice).

The choice is cached in ``$ENGINE_GEMM_CACHE_DIR`` (default ``~/.cache/lora-platform/gemm``) under a key made of
the CPU model and its GEMM-relevant flags, the torch version, a digest of the C kernels' sources, the thread count,
the dtype, the paths and the shapes with their weight formats, so a restart reads it instead of timing again (and a
new kernel is timed again); a choice timed on a busy machine is not cached, and keeps only each projection's
majority path (its band-by-band differences are noise then).
"""

import hashlib
import json
import logging
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.cpu_info import cpu_info
from engine.models import native_forward
from engine.models.gemm import PATHS, LinearKernel, available_paths
from engine.models.linear import Projection
from engine.models.quant import allows_w8a8, weight_format
from kernels.cpu import native

logger = logging.getLogger(__name__)

_FORMAT = 4  # of the cache files: a new format never reads an old file as its own (3: cold cycles; 4: dips)
_MARGIN = 0.10
# A path this much slower at one token count than at both neighbouring ones is timed there again (_dips).
_DIP = 0.25
# Rounds of calls per token count: at least _MIN_ROUNDS, more while they add up to less than _BUDGET_S seconds
# (small M is cheap and noisy).
_MIN_ROUNDS, _MAX_ROUNDS, _BUDGET_S = 3, 32, 5e-3
# Up to this many rows a call reads its weight more than it computes (bf16 on two cores: ~450 GFLOP/s against ~30
# GB/s): timed as whole cycles through the layers, the best of _MIN_CYCLES (_fastest_calls).
_COLD_TOKENS, _MIN_CYCLES = 16, 2
# A measurement is cached only if its threads ran most of the time it took (process CPU time over wall time times
# threads: 0.97 measured on a quiet 2-core VM, 0.38 with three other busy processes): a choice timed while other
# work held the cores would be kept for good.
_MIN_CPU_SHARE = 0.8
# What a step the C replay of the decoder layers cannot take (a projection there on torch or oneDNN) pays in Python,
# per layer, counted low: a one-sequence fp32 step of SmolLM2 (30 layers) took 26.7 ms with q|k|v and o on `torch`
# at M = 1 against 20.5 with them on `gemv` and replayed (Xeon 6/207, 2026-12-07); 3.5 ms of an 11.6 ms bf16 step on
# the Zen 4 VM.
_MODULE_OVERHEAD_S = 100e-6


@dataclass(slots=True)
class GemmGroup:
    """One projection of every decoder layer (their weights share a shape), or the vocabulary projection."""

    name: str  # "q_proj+k_proj+v_proj", ..., "lm_head"
    projections: list[Projection]
    max_tokens: int  # the most rows a step gives it
    paths: tuple[str, ...] = ()  # the GEMM paths its weights' format has here (set by choose_gemm)

    @property
    def weight_format(self) -> str:
        return weight_format(self.projections[0].gemm_weight)

    @property
    def shape(self) -> list:
        first = self.projections[0]
        return [self.name, first.out_features, first.in_features, first.bias is not None, len(self.projections),
                self.max_tokens, self.weight_format]

    def token_counts(self) -> list[int]:
        """M = 1, 2, 4, ... below ``max_tokens``, then ``max_tokens``."""
        powers = [1 << i for i in range(self.max_tokens.bit_length()) if 1 << i < self.max_tokens]
        return [*powers, self.max_tokens]


@dataclass(slots=True)
class GemmChoice:
    """Every group's bands and where they came from, for ``LLMEngine.stats()`` and the start-up log."""

    dtype: torch.dtype
    mode: str  # EngineConfig.gemm
    source: str  # "measured", "cache", or "fixed" (a path named by the config, or the only one available)
    bands: dict[str, list[tuple[int, str]]]  # group name -> (max tokens, path) by increasing max tokens
    gflops: dict[str, dict[str, list]] = field(default_factory=dict)  # group -> {"tokens": [M...], path: [...]}
    seconds: float = 0.0  # spent timing
    cache_file: str | None = None
    weights: dict[str, str] = field(default_factory=dict)  # group name -> weight format ("dense", "int8", "int4")
    replay_moves: list[dict] = field(default_factory=list)  # bands moved to a C path so that the replay takes them

    def describe(self) -> str:
        return "; ".join(f"{name} " + ", ".join(f"{path} M<={limit}" for limit, path in bands)
                         for name, bands in self.bands.items())

    def stats(self) -> dict:
        return {"dtype": str(self.dtype).removeprefix("torch."), "mode": self.mode, "source": self.source,
                "tuning_seconds": round(self.seconds, 2), "cache_file": self.cache_file, "weights": self.weights,
                "bands": {name: [{"max_tokens": limit, "path": path} for limit, path in bands]
                          for name, bands in self.bands.items()},
                "gflops": self.gflops, "replay_moves": self.replay_moves}


def choose_gemm(model, *, mode: str, dtype: torch.dtype, device: torch.device, max_num_batched_tokens: int,
                max_num_seqs: int) -> GemmChoice:
    """Pick every projection's GEMM path (a fixed one, the cached choice, or measured now) and bind it.

    ``mode`` fixes the path of float weights; quantized ones choose among their own paths (``quant``)."""
    groups = gemm_groups(model, max_num_batched_tokens, min(max_num_seqs, max_num_batched_tokens))
    dense = available_paths(device.type, dtype)
    if mode != "auto" and mode not in dense:
        raise ValueError(f"gemm={mode!r}: that path does not run {dtype} on {device.type} here "
                         f"(available: {', '.join(dense)})")
    fixed, timed = {}, []
    for group in groups:
        group.paths = tuple(path for path in available_paths(device.type, dtype, group.weight_format)
                            if path != "w8a8" or allows_w8a8(group.name))
        if mode != "auto" and group.weight_format == "dense":
            fixed[group.name] = [(group.max_tokens, mode)]
        elif len(group.paths) == 1:
            fixed[group.name] = [(group.max_tokens, group.paths[0])]
        else:
            timed.append(group)
    packed: dict[str, dict[str, list]] = {}
    if timed:
        choice, packed = _cached_or_measured(timed, dtype)
        choice.mode, choice.bands = mode, {g.name: fixed.get(g.name) or choice.bands[g.name] for g in groups}
    else:
        choice = GemmChoice(dtype, mode, "fixed", fixed)
    choice.weights = {group.name: group.weight_format for group in groups}
    if device.type == "cpu" and native_forward.enabled() and getattr(model, "group", None) is None:
        choice.bands, choice.replay_moves = _replayable(choice.bands, choice.gflops, groups)
    _bind(groups, choice, packed)
    detail = f" in {choice.seconds:.1f}s" if choice.source == "measured" else ""
    logger.info("GEMM paths for %s (%s%s): %s", str(dtype).removeprefix("torch."), choice.source, detail,
                choice.describe())
    return choice


def gemm_groups(model, max_tokens: int, max_sampled: int) -> list[GemmGroup]:
    """The model's projections grouped by name across layers, then the vocabulary projection."""
    groups: dict[str, GemmGroup] = {}
    for projection in model.layers.modules():
        if isinstance(projection, Projection):
            name = "+".join(projection.module_names)
            groups.setdefault(name, GemmGroup(name, [], max_tokens)).projections.append(projection)
    return [*groups.values(), GemmGroup("lm_head", [model.lm_head], max_sampled)]


def _cached_or_measured(groups: list[GemmGroup], dtype: torch.dtype):
    key = _cache_key(groups, dtype)
    path = cache_dir() / f"gemm-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"
    entry = _read_cache(path, key, groups)
    if entry is not None:
        bands = {name: [tuple(band) for band in value] for name, value in entry["bands"].items()}
        return GemmChoice(dtype, "auto", "cache", bands, entry["gflops"], entry["seconds"], str(path)), {}
    start, cpu_start = time.perf_counter(), time.process_time()
    gflops, packed = {}, {}
    for group in groups:
        gflops[group.name], packed[group.name] = _time_group(group, dtype)
    seconds = time.perf_counter() - start
    share = (time.process_time() - cpu_start) / (seconds * torch.get_num_threads())
    if share < _MIN_CPU_SHARE:
        # A busy timing's band-by-band differences are mostly noise (at M = 1 under load, F.linear won some bands
        # in four of five start-ups although oneDNN's prepacked GEMV took 7.1 ms a step against its 18.9 quiet):
        # only its majority is trusted, one path per projection.
        logger.warning("other work held the cores while the GEMMs were timed (%.0f%% of %d threads' time was "
                       "ours): each projection takes the path that won most of its bands, for this run only; the "
                       "next start times again", 100 * share, torch.get_num_threads())
        bands = {name: _majority(table) for name, table in gflops.items()}
        return GemmChoice(dtype, "auto", "measured", bands, gflops, seconds, str(path)), packed
    bands = {name: _pick(table) for name, table in gflops.items()}
    choice = GemmChoice(dtype, "auto", "measured", bands, gflops, seconds, str(path))
    _write_cache(path, {"key": key, "bands": bands, "gflops": gflops, "seconds": seconds, "cpu_share": share})
    return choice, packed


@torch.inference_mode()
def _time_group(group: GemmGroup, dtype: torch.dtype):
    """GFLOP/s of each path at each token count, and each path's operands (a packed copy of every weight). A token
    count where some path dips well below its neighbours (``_dips``) is timed once more, each path keeping its faster
    reading: a burst of other work over one count's few calls would otherwise be cached for good (the Zen 4 VM, int8
    vocabulary projection: `w8a8g` read 626, 272, 756 GFLOP/s at M = 32, 64, 128 while pip ran beside it, and M = 64,
    the offline workload's decode batch, went to `dequantized` at 430 against its 750: 1.24 s of a 9.8 s run)."""
    first, paths = group.projections[0], group.paths
    biases = [p.bias for p in group.projections]
    operands = {name: [PATHS[name].pack(p.gemm_weight) for p in group.projections] for name in paths}
    generator = torch.Generator().manual_seed(0)  # the global generator is the caller's
    tokens = group.token_counts()

    def measure(m: int) -> list[float]:
        x = torch.randn(m, first.in_features, generator=generator).to(dtype)  # [M, in]
        fits = tuple(name for name in paths if PATHS[name].max_tokens is None or m <= PATHS[name].max_tokens)
        seconds = _fastest_calls(fits, operands, biases, x)
        flops = 2 * m * first.in_features * first.out_features
        # a path past its max_tokens counts as 0 GFLOP/s: never chosen there
        return [flops / seconds[name] / 1e9 if name in seconds else 0.0 for name in paths]

    rows = [measure(m) for m in tokens]
    for i in _dips(rows):
        rows[i] = [max(before, again) for before, again in zip(rows[i], measure(tokens[i]), strict=True)]
    table: dict[str, list] = {"tokens": tokens,
                              **{name: [round(row[p], 1) for row in rows] for p, name in enumerate(paths)}}
    return table, operands


def _dips(rows: list[list[float]]) -> list[int]:
    """The token counts (indices; M = 1 aside, whose rate is naturally the lowest) where some path's GFLOP/s is more
    than _DIP below the lower of its neighbours' (the last count: below the one before it)."""
    def dips_at(i: int, p: int) -> bool:
        neighbours = [rows[j][p] for j in (i - 1, i + 1) if j < len(rows)]
        return 0 < rows[i][p] < (1 - _DIP) * min(neighbours) and all(neighbours)

    return [i for i in range(1, len(rows)) if any(dips_at(i, p) for p in range(len(rows[i])))]


def _fastest_calls(paths: tuple[str, ...], operands: dict[str, list], biases: list, x: torch.Tensor) -> dict:
    """Each path's time for a call at x's M, in seconds. The paths take turns, so a burst of other work on the machine
    slows them alike, and the fastest is kept: other work only ever adds time (as does the first call of a shape,
    which builds oneDNN's primitive). The calls cycle through the layers' weights. Up to _COLD_TOKENS rows, where a
    call's time is its weight's read, a path's time is the mean of a whole cycle through the layers (the fastest of
    _MIN_CYCLES cycles), not its fastest call, and each path reads another layer than the others at the same time: a
    step reads every weight cold, and `gemv` timed right after `torch` on the same plain weight read it from the L3
    (on the Zen 4 VM 28 us a call for q|k|v at M = 1 against 80 cold) and kept M = 1-4 of every layer projection,
    where a decode step of one sequence ran 11.2-12.0 ms against 9.5-9.8 on `packed`."""
    best = dict.fromkeys(paths, float("inf"))
    if x.shape[0] <= _COLD_TOKENS:
        layers = len(biases)
        # each path a layer of its own at a time, spread over the cycle: paths on one weight (`torch` and `gemv` read
        # the plain one) would otherwise find it in the cache where the other had just read it
        spread = [q * layers // len(paths) for q in range(len(paths))]
        for _ in range(_MIN_CYCLES):
            total = dict.fromkeys(paths, 0.0)
            for i in range(layers):
                for name, offset in zip(paths, spread, strict=True):
                    j = (i + offset) % layers
                    start = time.perf_counter()
                    PATHS[name].run(x, operands[name][j], biases[j])
                    total[name] += time.perf_counter() - start
            for name in paths:
                best[name] = min(best[name], total[name] / layers)
        return best
    spent, rounds = 0.0, 0
    while rounds < _MIN_ROUNDS or (spent < _BUDGET_S and rounds < _MAX_ROUNDS):
        i = rounds % len(biases)
        for name in paths:
            start = time.perf_counter()
            PATHS[name].run(x, operands[name][i], biases[i])
            elapsed = time.perf_counter() - start
            best[name], spent = min(best[name], elapsed), spent + elapsed
        rounds += 1
    return best


def _majority(table: dict[str, list]) -> list[tuple[int, str]]:
    """One band: the path that is fastest at most of the table's token counts."""
    paths = [name for name in table if name != "tokens"]
    winners = [max(paths, key=lambda name: table[name][i]) for i in range(len(table["tokens"]))]
    return [(table["tokens"][-1], Counter(winners).most_common(1)[0][0])]


def _pick(table: dict[str, list]) -> list[tuple[int, str]]:
    """Bands from a group's GFLOP/s table (see the module docstring for the margin)."""
    tokens, paths = table["tokens"], [name for name in table if name != "tokens"]
    winners = [max(paths, key=lambda name: table[name][i]) for i in range(len(tokens))]
    usual = Counter(winners).most_common(1)[0][0]
    bands: list[tuple[int, str]] = []
    for i, m in enumerate(tokens):
        best = winners[i]
        path = best if table[best][i] * (1 - _MARGIN) > table[usual][i] else usual
        if bands and bands[-1][1] == path:
            bands[-1] = (m, path)
        else:
            bands.append((m, path))
    return bands


def _replayable(bands: dict[str, list], gflops: dict[str, dict], groups: list[GemmGroup]):
    """The bands with the C replay's saving counted: at each timed M the replay takes (native_forward.MAX_TOKENS)
    where some layer projection's path is not one it records (``native_forward.REPLAYED_PATHS``), those projections
    move to their fastest path that is, if the time that adds to every layer's GEMMs together is less than the
    Python the replay saves (_MODULE_OVERHEAD_S a layer). Returns (bands, the moves made)."""
    layer_groups = [group for group in groups if group.name != "lm_head"]
    if not layer_groups or any(group.name not in gflops for group in layer_groups):
        return bands, []  # a fixed path (the config's, or the only one there is) has no times to weigh
    tokens = gflops[layer_groups[0].name]["tokens"]
    if any(gflops[group.name]["tokens"] != tokens for group in layer_groups):
        return bands, []
    saving = len(layer_groups[0].projections) * _MODULE_OVERHEAD_S
    paths = {group.name: [_path_at(bands[group.name], m) for m in tokens] for group in layer_groups}
    moves = []
    for i, m in enumerate(tokens):
        if m > native_forward.MAX_TOKENS:
            break
        cost, step_moves = 0.0, {}
        for group in layer_groups:
            table, chosen = gflops[group.name], paths[group.name][i]
            if chosen in native_forward.REPLAYED_PATHS:
                continue
            replayed = [path for path in native_forward.REPLAYED_PATHS if table.get(path) and table[path][i] > 0]
            if not replayed:
                cost = float("inf")  # this M cannot be replayed whatever the others do
                break
            best = max(replayed, key=lambda path: table[path][i])
            first = group.projections[0]
            gigaflop = 2 * m * first.in_features * first.out_features / 1e9
            extra = gigaflop / table[best][i] - (gigaflop / table[chosen][i] if table[chosen][i] > 0 else 0.0)
            cost += len(group.projections) * extra
            step_moves[group.name] = best
        if step_moves and cost < saving:
            for name, path in step_moves.items():
                moves.append({"group": name, "tokens": m, "from": paths[name][i], "to": path,
                              "gflops": [gflops[name][paths[name][i]][i], gflops[name][path][i]]})
                paths[name][i] = path
    if not moves:
        return bands, []
    logger.info("GEMM paths moved so that the C replay takes their steps (each adds less GEMM time than the %.1f ms "
                "of Python a replayed step saves): %s", 1e3 * saving,
                "; ".join(f"{move['group']} M={move['tokens']} {move['from']} -> {move['to']}" for move in moves))
    return {name: _bands_of(tokens, paths[name]) if name in paths else value for name, value in bands.items()}, moves


def _path_at(bands: list[tuple[int, str]], m: int) -> str:
    """The path the band holding ``m`` tokens runs (past the last band: the last)."""
    return next((path for limit, path in bands if m <= limit), bands[-1][1])


def _bands_of(tokens: list[int], paths: list[str]) -> list[tuple[int, str]]:
    """Bands (limit, path) from a path per timed token count, runs of one path merged."""
    bands: list[tuple[int, str]] = []
    for m, path in zip(tokens, paths, strict=True):
        if bands and bands[-1][1] == path:
            bands[-1] = (m, path)
        else:
            bands.append((m, path))
    return bands


def _bind(groups: list[GemmGroup], choice: GemmChoice, packed: dict) -> None:
    for group in groups:
        bands = choice.bands[group.name]
        if all(path == "torch" for _, path in bands):
            continue  # F.linear on the plain weight: the projection's default
        measured = packed.get(group.name, {})  # operands made while timing, reused rather than packed again
        used = {path for _, path in bands} & measured.keys()
        for i, projection in enumerate(group.projections):
            operands = {path: measured[path][i] for path in used}
            projection.use_kernel(LinearKernel(projection.gemm_weight, projection.bias, bands, operands))


# ---- the cache on disk
def cache_dir() -> Path:
    root = os.environ.get("ENGINE_GEMM_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lora-platform" / "gemm"


def _cache_key(groups: list[GemmGroup], dtype: torch.dtype) -> dict:
    info = cpu_info()
    paths = sorted({path for group in groups for path in group.paths})
    return {"format": _FORMAT, "cpu": info.model_name, "flags": info.gemm_flags, "torch": torch.__version__,
            "kernels": native.sources_digest(),  # a changed C kernel times its paths again
            "threads": torch.get_num_threads(), "dtype": str(dtype).removeprefix("torch."), "paths": paths,
            "shapes": [group.shape for group in groups]}


def _read_cache(path: Path, key: dict, groups: list[GemmGroup]) -> dict | None:
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("GEMM cache %s is unreadable (%s): timing again", path, exc)
        return None
    if not _is_valid_entry(entry, key, {group.name: group.paths for group in groups}):
        logger.warning("GEMM cache %s does not match this model and machine: timing again", path)
        return None
    return entry


def _is_valid_entry(entry, key: dict, paths: dict[str, tuple[str, ...]]) -> bool:
    if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("gflops"), dict):
        return False
    bands = entry.get("bands")
    return isinstance(bands, dict) and set(bands) == set(paths) and all(
        value and all(len(band) == 2 and band[1] in paths[name] for band in value) for name, value in bands.items())


def _write_cache(path: Path, entry: dict) -> None:
    # A temporary name then a rename: a concurrent start never reads a half-written file.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as file:
                json.dump(entry, file, indent=1)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        logger.warning("could not write the GEMM cache %s (%s): the next start times again", path, exc)
