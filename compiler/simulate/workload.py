"""Requests to replay: from a generator (`PROFILES`) or a JSON Lines trace.

Every generator draws from a numpy Generator seeded by the caller, so a seed gives the same
requests. Lengths follow gamma distributions with the deployment workload's mean and
coefficient of variation (the family is assumed; the closed form uses only mean and CV).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler.perf.serving import Workload
from schemas.diagnostics import CompileError, Diagnostic

PROFILES = ("closed", "poisson", "bursty", "agentic")
BURST_CV = 4.0  # assumed: inter-arrival CV of the bursty profile (gamma arrivals)
THINK_S = 2.0  # assumed: mean tool-call time between an agent's turns (exponential)
BRANCH_P = 0.1  # assumed: share of agent turns that start a sub-agent
BRANCH_TURNS = 3  # assumed: turns of a sub-agent before it returns to its parent
CONTEXT_CAP = 131072  # an agent's context is reset beyond this (InferenceX issue 1632's cap)
TRACE_FIELDS = ("arrival_s", "session", "think_s", "input_tokens", "output_tokens",
                "prefix_tokens", "hash_ids")
# the Mooncake trace's names (kvcache-ai/Mooncake's FAST25-release traces, as Dynamo's
# benchmarks/data_generator/README.md and AIPerf's trace replay read them): timestamp in ms
MOONCAKE_FIELDS = {"timestamp": "arrival_s", "input_length": "input_tokens",
                   "output_length": "output_tokens"}
# tokens per hash block of a Mooncake trace (Dynamo's benchmarks/data_generator/README.md:
# "block_size" 512 in its example; AISBench's mooncake_trace README: 512 tokens by default)
TRACE_BLOCK_SIZE = 512
TRACE_MAX_LINES = 10_000_000


@dataclass(frozen=True)
class Requests:
    """One row per request, in issue order. Closed-loop requests (client >= 0) are issued
    `think_us` after their client's previous one finishes (the first at `arrival_us`);
    open-loop ones (client -1) at `arrival_us`. `reuse` input tokens continue the context
    of session `parent` (its own session, or the one a sub-agent branched from)."""

    isl: np.ndarray
    osl: np.ndarray
    reuse: np.ndarray
    session: np.ndarray
    parent: np.ndarray
    client: np.ndarray
    arrival_us: np.ndarray
    think_us: np.ndarray
    warm: np.ndarray | None = None  # per request: its `reuse` context may be in the pool at
    # the start (earlier turns before the run); None: every request's may

    def __len__(self) -> int:
        return len(self.isl)


def _lengths(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    if cv <= 0:
        return np.full(n, max(1, round(mean)), dtype=np.int64)
    k = 1.0 / (cv * cv)
    return np.maximum(1, np.rint(rng.gamma(k, mean / k, n))).astype(np.int64)


def generate(profile: str, w: Workload, n: int, seed: int, rate_per_s: float | None = None,
             max_len: int = CONTEXT_CAP) -> Requests:
    rng = np.random.default_rng(seed)
    if profile == "agentic":
        return _agentic(rng, w, n, max_len)
    # a session keeps one context length (its window of earlier turns): each of its
    # requests continues `prefix_reuse` of it, as the closed form's working set assumes
    sessions = max(1, round(w.sessions))
    context = np.minimum(_lengths(rng, w.isl, w.isl_cv, sessions), max_len - 1)
    osl_all = _lengths(rng, w.osl, w.osl_cv, n)
    clients = max(1, round(w.concurrency))
    idx = np.arange(n)
    if profile == "closed":
        # a benchmark client at fixed concurrency: request i goes to client i mod c, which
        # cycles through its share of the sessions
        client = idx % clients
        session = (client + clients * ((idx // clients) % max(1, sessions // clients))) \
            % sessions
        isl, osl, reuse = _turns(context, session, osl_all, w.prefix_reuse, max_len)
        zeros = np.zeros(n)
        return Requests(isl, osl, reuse, session, session, client, zeros, zeros)
    if rate_per_s is None or rate_per_s <= 0:
        raise ValueError("an open-loop profile needs a positive request rate")
    mean_gap = 1e6 / rate_per_s
    if profile == "poisson":
        gaps = rng.exponential(mean_gap, n)
    else:
        k = 1.0 / (BURST_CV * BURST_CV)
        gaps = rng.gamma(k, mean_gap / k, n)
    session = rng.integers(0, sessions, n)
    isl, osl, reuse = _turns(context, session, osl_all, w.prefix_reuse, max_len)
    return Requests(isl, osl, reuse, session, session, np.full(n, -1), np.cumsum(gaps),
                    np.zeros(n))


def _turns(context: np.ndarray, session: np.ndarray, osl: np.ndarray, reuse_share: float,
           max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    isl = context[session]
    return isl, np.minimum(osl, max_len - isl), np.rint(isl * reuse_share).astype(np.int64)


def _agentic(rng: np.random.Generator, w: Workload, n: int, max_len: int) -> Requests:
    """Closed-loop agents: each client runs sessions whose context grows turn by turn (the
    previous input and output stay, `isl * (1 - prefix_reuse)` new tokens come each turn),
    waits a think time between turns, sometimes branches a sub-agent that starts from its
    parent's context, and starts a fresh session once the context passes the cap."""
    clients = max(1, round(w.concurrency))
    new_mean = max(1.0, w.isl * (1 - w.prefix_reuse))
    cols = {k: np.zeros(n, dtype=np.int64) for k in ("isl", "osl", "reuse", "session",
                                                      "parent", "client")}
    think = np.zeros(n)
    osl = _lengths(rng, w.osl, w.osl_cv, n)
    new = _lengths(rng, new_mean, w.isl_cv, n)
    start = _lengths(rng, w.isl, w.isl_cv, clients)
    context = np.minimum(start, max_len // 2).astype(np.int64)  # fresh sessions' prompts
    session = np.arange(clients, dtype=np.int64)
    next_session = clients
    branch_left = np.zeros(clients, dtype=np.int64)
    branch_of = np.full(clients, -1, dtype=np.int64)
    branch_ctx = np.zeros(clients, dtype=np.int64)
    u = rng.random(n)
    gaps = rng.exponential(THINK_S * 1e6, n)
    for i in range(n):
        c = i % clients
        first = i < clients
        if branch_left[c] > 0 and branch_ctx[c] + new[i] + osl[i] <= max_len:
            # a sub-agent's turn, on its own session
            s, ctx = branch_of[c], branch_ctx[c]
            parent = s if branch_left[c] < BRANCH_TURNS else session[c]
            reuse = ctx
            isl = ctx + new[i]
            branch_left[c] -= 1
            branch_ctx[c] = isl + osl[i]
        else:
            branch_left[c] = 0  # (a sub-agent whose context is full returns)
            s, parent = session[c], session[c]
            reuse = 0 if first else context[c]
            isl = context[c] + (0 if first else new[i])
            if isl + osl[i] > max_len:  # context reset: a new session from a fresh prompt
                s = parent = session[c] = next_session
                next_session += 1
                isl, reuse = int(start[c % clients]), 0
            context[c] = isl + osl[i]
            if not first and u[i] < BRANCH_P:
                branch_left[c], branch_of[c] = BRANCH_TURNS, next_session
                branch_ctx[c] = context[c]
                next_session += 1
        cols["isl"][i], cols["osl"][i], cols["reuse"][i] = isl, osl[i], reuse
        cols["session"][i], cols["parent"][i], cols["client"][i] = s, parent, c
        think[i] = 0.0 if first else gaps[i]
    return _capped(cols, think, max_len)


def _capped(cols: dict[str, np.ndarray], think: np.ndarray, max_len: int) -> Requests:
    """Closed-loop turns (arrivals at 0, think times between turns) within the context cap:
    a prompt of at most max_len - 1 tokens, its output up to the cap."""
    osl_capped = np.minimum(cols["osl"], max_len - np.minimum(cols["isl"], max_len - 1))
    return Requests(np.minimum(cols["isl"], max_len - 1), osl_capped, cols["reuse"],
                    cols["session"], cols["parent"], cols["client"], np.zeros(len(think)),
                    think)


def _bad(file: str, line: int, path: str, expected: str, got: str) -> Diagnostic:
    return Diagnostic("error", "E752", file, line, 1, path, expected, got,
                      "each line: {\"arrival_s\" or \"session\", \"input_tokens\", "
                      "\"output_tokens\"[, \"prefix_tokens\" or \"hash_ids\", \"think_s\"]}, "
                      "or a Mooncake trace's {\"timestamp\", \"input_length\", "
                      "\"output_length\", \"hash_ids\"} (docs/simulate.md)")


def read_trace(path: Path, file: str, max_len: int = CONTEXT_CAP,
               block_size: int = TRACE_BLOCK_SIZE) -> Requests:
    """A JSON Lines trace: per line `input_tokens`, `output_tokens`, optional
    `prefix_tokens` (of the input, the session's earlier context) or `hash_ids` (its prompt's
    blocks of `block_size` tokens, as Mooncake traces give them: `hash_prefixes` turns them
    into the earlier request each continues) and either `arrival_s` (open loop) or `session`
    with `think_s` (turns of a session follow each other in file order, each `think_s` after
    the previous finished). A Mooncake trace's `timestamp` (ms), `input_length` and
    `output_length` are read as those. All bad lines are reported at once."""
    rows, errors = [], []
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            if number > TRACE_MAX_LINES:
                errors.append(_bad(file, number, "", f"at most {TRACE_MAX_LINES} lines",
                                   "more"))
                break
            if not text.strip():
                continue
            row = _trace_row(text, file, number, max_len, block_size, errors)
            if row is not None:
                rows.append(row)
    if not rows and not errors:
        errors.append(_bad(file, 1, "", "at least one request", "an empty file"))
    if errors:
        raise CompileError(errors[:50])
    hashes = [r.pop("hash_ids") for r in rows]
    arr = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    sessions = arr["session"].astype(np.int64)
    open_loop = sessions < 0
    order = np.argsort(np.where(open_loop, arr["arrival_s"], 0.0), kind="stable")
    arr = {k: v[order] for k, v in arr.items()}
    sessions = arr["session"].astype(np.int64)
    isl = arr["input_tokens"].astype(np.int64)
    key = np.where(sessions < 0, -1 - np.arange(len(sessions)), sessions)
    parent, reuse = key.copy(), arr["prefix_tokens"].astype(np.int64)
    hashed = [hashes[j] for j in order.tolist()]
    warm = None
    if any(h is not None for h in hashed):
        key, parent, reuse = hash_prefixes(hashed, isl, key, parent, reuse, block_size)
        warm = np.array([h is None for h in hashed])
    return Requests(isl, arr["output_tokens"].astype(np.int64), reuse, key, parent, sessions,
                    arr["arrival_s"] * 1e6, arr["think_s"] * 1e6, warm)


def hash_prefixes(hashed: list[list[int] | None], isl: np.ndarray, key: np.ndarray,
                  parent: np.ndarray, reuse: np.ndarray, block_size: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests given as block hashes (in issue order) as the simulator's prefix model sees
    them: each continues the earlier request that shares the longest run of leading blocks
    with it (a trie of the block sequences seen so far, as a radix-tree prefix cache matches
    them; of several, the first to bring the blocks, whose entry its followers' hits keep
    warm and which has stored them soonest), `reuse` = those blocks' tokens. A request that
    continues the whole of the earlier one's blocks takes over its cache key (a
    conversation's next turn: one growing entry);
    one that branches off keeps its own key, so the shared blocks are held once per branch
    (an upper bound on the cache space a block-level cache would need). None of it is in
    a cache before the run (`Requests.warm`): the trace is the whole history."""
    key, parent, reuse = key.copy(), parent.copy(), reuse.copy()
    trie: dict[tuple[int, int], int] = {}
    owner = [0]  # per trie node: the key of the request that brought it (node 0: the root)
    length: dict[int, int] = {}  # per key: blocks of its latest request
    for i, ids in enumerate(hashed):
        if ids is None:
            continue
        node, depth = 0, 0
        for h in ids:
            nxt = trie.get((node, h))
            if nxt is None:
                break
            node, depth = nxt, depth + 1
        if depth:
            o = owner[node]
            parent[i] = o
            reuse[i] = min(int(isl[i]), depth * block_size)
            if length.get(o) == depth:
                key[i] = o
        else:
            parent[i] = key[i]
        me = int(key[i])
        node = 0
        for h in ids:
            nxt = trie.get((node, h))
            if nxt is None:
                nxt = trie[(node, h)] = len(owner)
                owner.append(me)
            node = nxt
        length[me] = len(ids)
    return key, parent, reuse


def _trace_object(text: str, file: str, number: int, errors: list[Diagnostic]) -> dict | None:
    """A trace line as a JSON object of known fields, Mooncake's names taken as ours."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        errors.append(_bad(file, number, "", "a JSON object", f"bad JSON ({exc.msg})"))
        return None
    if not isinstance(obj, dict):
        errors.append(_bad(file, number, "", "a JSON object", type(obj).__name__))
        return None
    unknown = sorted(set(obj) - set(TRACE_FIELDS) - set(MOONCAKE_FIELDS))
    if unknown:
        errors.append(_bad(file, number, unknown[0],
                           " | ".join(TRACE_FIELDS + tuple(MOONCAKE_FIELDS)), repr(unknown[0])))
        return None
    for alias, name in MOONCAKE_FIELDS.items():
        if alias in obj:
            if name in obj:
                errors.append(_bad(file, number, alias, f"one of {alias} and {name}", "both"))
                return None
            v = obj.pop(alias)
            obj[name] = v / 1e3 if alias == "timestamp" and _is_number(v) else v
    return obj


def _field(obj: dict, key: str, bounds: tuple[float, float], default: float | None,
           integer: bool, where: tuple[str, int], errors: list[Diagnostic]) -> float | None:
    """A numeric field within `bounds` (an integer where `integer`), else a diagnostic."""
    lo, hi = bounds
    v = obj.get(key, default)
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
        and lo <= v <= hi and (not integer or float(v).is_integer())
    if not ok:
        kind = "an integer" if integer else "a number"
        errors.append(_bad(*where, key, f"{kind} from {lo:g} to {hi:g}",
                           json.dumps(v) if key in obj else "missing"))
        return None
    return v


def _trace_row(text: str, file: str, number: int, max_len: int, block_size: int,
               errors: list[Diagnostic]) -> dict | None:
    obj = _trace_object(text, file, number, errors)
    if obj is None:
        return None

    def field(key: str, lo: float, hi: float, default: float | None, integer: bool):
        return _field(obj, key, (lo, hi), default, integer, (file, number), errors)

    isl = field("input_tokens", 1, max_len - 1, None, True)
    osl = field("output_tokens", 1, max_len, None, True)
    prefix = field("prefix_tokens", 0, max_len, 0, True)
    session = field("session", 0, 2**31, -1 if "arrival_s" in obj else None, True) \
        if "session" in obj or "arrival_s" not in obj else -1
    arrival = field("arrival_s", 0, 1e7, 0.0, False)
    think = field("think_s", 0, 1e5, 0.0, False)
    if None in (isl, osl, prefix, session, arrival, think):
        return None
    if prefix > isl:
        errors.append(_bad(file, number, "prefix_tokens", f"at most input_tokens ({isl})",
                           str(prefix)))
        return None
    hashes = obj.get("hash_ids")
    if hashes is not None and not _hash_ids_ok(hashes, isl, block_size, "prefix_tokens" in obj,
                                               file, number, errors):
        return None
    return {"input_tokens": isl, "output_tokens": osl, "prefix_tokens": prefix,
            "session": session, "arrival_s": float(arrival), "think_s": float(think),
            "hash_ids": hashes}


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _hash_ids_ok(hashes: object, isl: int, block_size: int, has_prefix: bool, file: str,
                 number: int, errors: list[Diagnostic]) -> bool:
    """A non-empty list of integer block hashes, at most one per `block_size` tokens of the
    prompt (its last block may be partial), on a line that gives no `prefix_tokens` too."""
    blocks = -(-isl // block_size)
    if has_prefix:
        errors.append(_bad(file, number, "hash_ids", "hash_ids or prefix_tokens", "both"))
    elif not isinstance(hashes, list) or not hashes \
            or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
        errors.append(_bad(file, number, "hash_ids", "a non-empty list of integers",
                           json.dumps(hashes)[:60]))
    elif len(hashes) > blocks:
        errors.append(_bad(file, number, "hash_ids", f"at most {blocks} blocks of "
                           f"{block_size} tokens for {isl} input tokens", str(len(hashes))))
    else:
        return True
    return False
