"""The decision logic of `pdserve-cluster --autoscale`: pure (no processes, no HTTP, the time is
an argument), so tests drive it with made-up GET /cluster/advice answers.

Per pool (prefill, decode) with bounds MIN:MAX, at each poll of the advice:
  * target = the advice's recommendation for the pool, clamped to [MIN, MAX]; when no request
    finished in the advice's window (an idle cluster) the target is MIN; when requests finished
    but a capacity is unknown (no recommendation) there is no target and the pool holds;
  * current = the pool's nodes that the proxy routes to (`load.<pool>.nodes`: draining and
    silent nodes do not count);
  * current < target for `up_polls` polls in a row: add one node; current > target for
    `down_polls` polls in a row: drain one node (hysteresis: one poll that disagrees restarts
    the count);
  * after an action the pool's counts restart, and polls during the next `cooldown_s` do not
    count (the advice needs time to see the new pool size).
One node per action: the advice is measured on the pool as it is, and a step of one keeps a
wrong measurement cheap.
"""
from dataclasses import dataclass, field

POOLS = ("prefill", "decode")


def parse_bounds(text):
    """'MIN:MAX' -> (MIN, MAX); ValueError with a reason for anything else."""
    parts = text.split(":")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise ValueError(f"'{text}' is not MIN:MAX (two non-negative integers)")
    minimum, maximum = int(parts[0]), int(parts[1])
    if maximum < minimum or maximum < 1:
        raise ValueError(f"'{text}': MAX must be at least MIN and at least 1")
    return minimum, maximum


def combine_advice(answers):
    """One GET /cluster/advice answer from those of the proxy replicas in front of one cluster.
    Each replica measures the requests it served, so its recommendation is for its share of the
    workload, and the cluster needs the sum of the replicas' (each rounded up on its own: at most
    one node per extra replica more than a single proxy would ask for). Pool loads are the nodes'
    own reports, the same at every replica: the first answer's. A replica that served requests
    but has no recommendation makes the pool hold; replicas that served none add nothing; all
    idle: idle."""
    if not answers:
        raise ValueError("no proxy answered")
    if len(answers) == 1:
        return answers[0]
    busy = [answer for answer in answers if answer["workload"]["requests"] > 0]
    recommendation = {}
    for pool in POOLS:
        wanted = [answer["recommendation"][f"{pool}_nodes"] for answer in busy]
        known = busy and all(isinstance(count, int) for count in wanted)
        recommendation[f"{pool}_nodes"] = sum(wanted) if known else None
    return {"load": answers[0]["load"], "recommendation": recommendation,
            "workload": {"requests": sum(answer["workload"]["requests"] for answer in answers)}}


@dataclass
class Decision:
    pool: str
    action: str  # "up" or "down"
    current: int
    target: int
    reason: str


@dataclass
class _PoolState:
    minimum: int
    maximum: int
    above: int = 0  # polls in a row with current < target
    below: int = 0  # polls in a row with current > target
    cooldown_until: float = float("-inf")


@dataclass
class AutoscalePolicy:
    bounds: dict  # pool -> (MIN, MAX); pools not named keep their size
    up_polls: int = 3
    down_polls: int = 6
    cooldown_s: float = 30.0
    _pools: dict = field(init=False, repr=False)

    def __post_init__(self):
        if self.up_polls < 1 or self.down_polls < 1 or self.cooldown_s < 0:
            raise ValueError("up_polls and down_polls must be at least 1 and cooldown_s at least 0")
        self._pools = {pool: _PoolState(*self.bounds[pool]) for pool in POOLS if pool in self.bounds}

    def target(self, pool, advice):
        """(target node count or None to hold, why)."""
        state = self._pools[pool]
        recommended = advice["recommendation"][f"{pool}_nodes"]
        if isinstance(recommended, int):
            target = min(max(recommended, state.minimum), state.maximum)
            bounded = "" if target == recommended else f", bounded to {state.minimum}:{state.maximum}"
            return target, f"the advice asks for {recommended} {pool} nodes{bounded}"
        if advice["workload"]["requests"] == 0:
            return state.minimum, "no request finished in the advice window (idle)"
        return None, "the advice has no recommendation (a capacity is not measured yet)"

    def decide(self, advice, now):
        """The actions this poll of the advice calls for (at most one per pool)."""
        decisions = []
        for pool, state in self._pools.items():
            current = advice["load"][pool]["nodes"]
            target, why = self.target(pool, advice)
            # Polls during the cool-down do not count: the advice still measures the old pool.
            if target is None or current == target or now < state.cooldown_until:
                state.above = state.below = 0
                continue
            if current < target:
                state.above, state.below = state.above + 1, 0
            else:
                state.above, state.below = 0, state.below + 1
            if state.above >= self.up_polls:
                decisions.append(Decision(pool, "up", current, target,
                                          f"{why}, {current} routable, {state.above} polls in a row"))
            elif state.below >= self.down_polls:
                decisions.append(Decision(pool, "down", current, target,
                                          f"{why}, {current} routable, {state.below} polls in a row"))
        return decisions

    def acted(self, pool, now):
        """Starts the pool's cool-down (call it after an action, whether it worked or not)."""
        state = self._pools[pool]
        state.above = state.below = 0
        state.cooldown_until = now + self.cooldown_s
