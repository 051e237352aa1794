"""The pack's HTTP glue on ComfyUI's server: GET /ssd/models (what the pack keeps in memory), and its templates
listed in file-name order in the template browser."""

import json
from pathlib import Path

from ._comfy import module
from ._patcher import held_models

PACK_FOLDER = Path(__file__).parents[1].name  # the name ComfyUI lists the pack's templates under (its folder)
TEMPLATE_LISTS = ("/workflow_templates", "/api/workflow_templates")


def register_routes():
    """GET /ssd/models: held_models() as JSON; and the template order (own_templates_in_order)."""
    web = module("aiohttp.web", "json_response")
    server = module("server", "PromptServer")
    if web is None or server is None or getattr(server.PromptServer, "instance", None) is None:
        return

    @server.PromptServer.instance.routes.get("/ssd/models")
    async def _held(request):
        return web.json_response({"models": held_models()})

    middlewares = getattr(getattr(server.PromptServer.instance, "app", None), "middlewares", None)
    if middlewares is not None and not middlewares.frozen:  # ComfyUI loads custom nodes before its server starts
        middlewares.append(own_templates_in_order(web))


def own_templates_in_order(web):
    """An aiohttp middleware: GET /workflow_templates lists this pack's templates sorted by name, ignoring case.

    ComfyUI lists them in the order glob finds the files, the directory's (on ext4 a hash order fixed when the disk
    was formatted), and frontend 1.58's default sort keeps that order: the bundled 24x24 template, named to sort
    first, could come after a 7B one that needs a 14 GB download. Every other pack's list is left as it is."""

    @web.middleware
    async def _order(request, handler):
        response = await handler(request)
        if request.method != "GET" or request.path not in TEMPLATE_LISTS or \
                getattr(response, "content_type", None) != "application/json" or not getattr(response, "body", None):
            return response
        listed = json.loads(response.body)
        if not isinstance(listed, dict) or not isinstance(listed.get(PACK_FOLDER), list):
            return response
        listed[PACK_FOLDER] = sorted(listed[PACK_FOLDER], key=str.casefold)
        return web.json_response(listed)

    return _order
