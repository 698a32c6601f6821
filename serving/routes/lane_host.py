"""Where the offline lane meets the LLM ingress: IngressLaneHost is the LaneHost
(serving/batch/lane.py) the lane asks, built on the Ingress's public surface
(serving/llm/ingress.py). serving/batch/ never imports serving/llm/; this module imports both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from serving.api import openai as p
from serving.api.errors import ApiError
from serving.api.http import validate
from serving.batch import jobs
from serving.batch.lane import LaneLimits, ReplicaLoad
from serving.config import AppConfig
from serving.llm import tools
from serving.llm.admission import max_in_replica
from serving.llm.ingress import Ingress
from serving.serve_status import running_replicas


def lane_limits(cfg: AppConfig, replica_capacity_rps: float) -> LaneLimits:
    """The lane's fixed numbers: a replica's lower-tier slots (admission's limit, at most the
    engine's batch), its offline idle fraction, and the capacity the controller plans with."""
    rep, engine = cfg.replica, cfg.engine
    slots = min(max_in_replica("offline", rep.max_ongoing_requests), engine.max_num_seqs)
    return LaneLimits(slots, engine.offline_idle_fraction, replica_capacity_rps)


class IngressLaneHost:
    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress

    async def run_line(self, url: str, body: dict, opened: Callable[[int], None]) -> dict:
        """One batch line, in the offline tier whatever its body says: the same validation,
        template and replicas as the HTTP routes."""
        ing = self.ingress
        kind = p.ChatCompletionRequest if url == jobs.CHAT else p.CompletionRequest
        req = validate(kind, {**body, "priority": "offline"})
        ing.adapters.resolve(req.model)  # the base model or a served adapter, else a 404
        opened(req.num_choices)
        plan = tools.plan_for(req) if kind is p.ChatCompletionRequest else None
        answer = await ing.answer(req, "offline", ing.encode(req, plan), plan)
        if not isinstance(answer, dict):  # jobs.parse_input refuses such lines before this
            raise ApiError(400, "body.stream=true is not allowed in a batch", param="stream")
        return answer

    async def pool_loads(self) -> Mapping[str, ReplicaLoad]:
        return (await self.ingress.pool_view()).infos

    def replica_counts(self) -> Mapping[str, int]:
        return running_replicas(self.ingress.app_name)

    def num_requests(self) -> int:
        return self.ingress.num_requests
