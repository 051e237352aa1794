"""Progress while a node runs: ComfyUI's progress bar (with previews) and the widget's live events."""

import time

from ._comfy import module
from . import _devices


class Progress:
    """ComfyUI's progress bar (with previews) and the live ``ssd.grid`` events; no-ops without
    ComfyUI. Both are throttled (every progress update costs ComfyUI two websocket messages):
    ``update`` to ``bar_interval`` seconds unless it carries a preview or ends the run, ``send``
    to ``min_interval`` seconds unless ``force``."""

    def __init__(self, total, node_id=None, min_interval=0.05, bar_interval=0.1):
        self.node_id = node_id
        self.min_interval = min_interval
        self.bar_interval = bar_interval
        self._last_send = 0.0
        self._last_bar = 0.0
        utils = module("comfy.utils", "ProgressBar")
        self.bar = None if utils is None else utils.ProgressBar(total)
        server = module("server", "PromptServer")
        self.server = None if server is None else getattr(server.PromptServer, "instance", None)

    def update(self, value, total, preview=None):
        if self.bar is None or _devices.processing_interrupted():
            # leave the cancel to the engine's should_cancel, which keeps the model usable
            return
        now = time.monotonic()
        if preview is None and value < total and now - self._last_bar < self.bar_interval:
            return
        self._last_bar = now
        self.bar.update_absolute(value, total, preview)

    def due(self):
        return time.monotonic() - self._last_send >= self.min_interval

    def send(self, event, data, force=False):
        if self.server is None or (not force and not self.due()):
            return False
        self._last_send = time.monotonic()
        payload = dict(data)
        payload["node"] = None if self.node_id is None else str(self.node_id)
        self.server.send_sync(event, payload, getattr(self.server, "client_id", None))
        return True
