"""A small synthetic cluster for the simulator's unit and property tests: step times linear
in tokens and batch (a test double with known costs, so the tests can say what must happen);
the real perf model is exercised by test_plan_run.py on the example plan."""

from compiler.simulate.cluster import Cluster, InstanceInfo, RankInfo, Segment


class LinearSteps:
    """Decode: 1000 us + 10 us per request of the busiest rank; prefill: 100 us + 1 us per
    token of the busiest rank."""

    def decode_us(self, mean_batch: float, max_batch: int, kv_len: float) -> float:
        return 1000.0 + 10.0 * max_batch

    def prefill_us(self, tokens: float, new: float, cached: float) -> tuple[float, float]:
        return 100.0 + tokens, 0.0


def instance(id_: str, role: str, dp: int = 1, max_seqs: int = 8, max_tokens: int = 2048,
             kv_tokens: int = 100_000, domain: str = "nvl0", tray: str = "r0-t00",
             draft: int = 0, acceptance: float = 1.0) -> InstanceInfo:
    ranks = tuple(RankInfo((f"{tray}-{id_}-g{d}",), (tray,), domain) for d in range(dp))
    return InstanceInfo(id_, role, ranks, max_seqs, max_tokens, kv_tokens, LinearSteps(),
                        draft, acceptance, 100.0, frozenset(r.gpus[0] for r in ranks), True)


class _System:
    class latency:
        class p2p_us:
            value = 10.0


def cluster(instances: list[InstanceInfo], pool_tokens: int = 0) -> Cluster:
    segs = (Segment("r0-t00", "r0-t00", pool_tokens),) if pool_tokens else ()
    return _Cluster(tuple(instances), segs, 16, "kv", 1.0, 100.0, 400.0, "synthetic", 1, None)


class _Cluster(Cluster):
    def transfer_us(self, nbytes: float, kind: str, system: str = "") -> float:
        return 10.0 + nbytes / (100e3 if kind == "nvlink" else 50e3)
