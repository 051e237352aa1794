"""The pack's HTTP route on ComfyUI's server: GET /ssd/models (what the pack keeps in memory)."""

from ._comfy import module
from ._patcher import held_models


def register_routes():
    """GET /ssd/models: held_models() as JSON (what the pack keeps in memory)."""
    web = module("aiohttp.web", "json_response")
    server = module("server", "PromptServer")
    if web is None or server is None or getattr(server.PromptServer, "instance", None) is None:
        return

    @server.PromptServer.instance.routes.get("/ssd/models")
    async def _held(request):
        return web.json_response({"models": held_models()})
