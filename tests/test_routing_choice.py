"""``serving.gateway.upstream.routing.choose_replica``: the routing choice as a pure function of the
replicas' state, apart from the membership and rotation ``Upstreams`` keeps."""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.gateway.upstream.prompt_key import prompt_key
from serving.gateway.upstream.routing import MIN_MATCH_TOKENS, ReplicaRouting, choose_replica
from vigil.conventions import ENDPOINT_CHAT


@dataclass(eq=False)
class FakeReplica:
    name: str
    in_flight: int = 0
    healthy: bool = True
    kv_usage: float | None = 0.1
    routing: ReplicaRouting = field(default_factory=ReplicaRouting)

    @property
    def outstanding(self) -> int:
        return self.in_flight


def room(r: FakeReplica) -> bool:
    return r.healthy and (r.kv_usage is None or r.kv_usage <= 0.9)


def test_least_outstanding_ties_go_to_the_first_in_rotation_order() -> None:
    a, b, c = FakeReplica("a", 2), FakeReplica("b", 1), FakeReplica("c", 1)
    assert choose_replica([a, b, c], 0, has_room=room) == (b, None)
    assert choose_replica([a, b, c], 2, has_room=room) == (c, None)
    assert choose_replica([a, b, c], 2, has_room=room, exclude=c) == (b, None)


def test_no_room_refuses_unless_premium_which_takes_the_least_kv_usage() -> None:
    a = FakeReplica("a", 0, kv_usage=0.97)
    b = FakeReplica("b", 3, kv_usage=0.95)
    down = FakeReplica("d", 0, healthy=False, kv_usage=0.0)
    assert choose_replica([a, b, down], 0, has_room=room) == (None, None)
    assert choose_replica([a, b, down], 0, has_room=room, beyond_kv_limit=True) == (b, None)
    assert choose_replica([], 0, has_room=room, beyond_kv_limit=True) == (None, None)


def test_a_prompt_goes_where_its_prefix_is_and_nothing_is_changed() -> None:
    text = "You are a support agent for an airline. " * 200  # well past MIN_MATCH_TOKENS
    prompt = prompt_key(ENDPOINT_CHAT,
                        {"messages": [{"role": "system", "content": text},
                                      {"role": "user", "content": "hello"}]})
    assert prompt is not None and prompt.tokens > MIN_MATCH_TOKENS
    holder, other = FakeReplica("holder", 2), FakeReplica("other", 0)
    holder.routing.record(prompt.hashes)
    before = (holder.routing.prefix_routed, holder.routing.load_routed, holder.in_flight)
    assert choose_replica([other, holder], 0, has_room=room, prompt=prompt) == (holder,
                                                                                 "prefix")
    assert (holder.routing.prefix_routed, holder.routing.load_routed,
            holder.in_flight) == before  # pure: the caller counts
    # Past the load bound the prefix is not worth it: the least loaded replica, by load.
    holder.in_flight = 40
    assert choose_replica([other, holder], 0, has_room=room, prompt=prompt) == (other, "load")
    # Held nowhere: by load.
    assert choose_replica([other, FakeReplica("x", 1)], 0, has_room=room,
                          prompt=prompt) == (other, "load")
