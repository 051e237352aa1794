"""The pack inside a real ComfyUI server (runs when SSD_COMFYUI_DIR points at a ComfyUI checkout).

    SSD_COMFYUI_DIR=/path/to/ComfyUI SSD_COMFYUI_PYTHON=/path/to/comfy-venv/bin/python pytest tests/test_comfyui.py

The server runs from its checkout with --cpu on 127.0.0.1 and a throw-away --base-directory whose
custom_nodes/ComfyUI-SSD links to this repository (nothing is written into the checkout).
SSD_COMFYUI_PYTHON defaults to the interpreter running pytest; it needs ComfyUI's requirements,
`requests` and `websocket-client`. SSD_COMFYUI_PACK (optional) loads another copy of the pack (make test-host: the
Manager's clone in the host's custom_nodes). SSD_COMFYUI_ARGS (optional) adds server flags, e.g. `--enable-manager`.
"""

import io
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACK_NAME = "ComfyUI-SSD"
COMFY_DIR = os.environ.get("SSD_COMFYUI_DIR", "")
COMFY_PY = os.environ.get("SSD_COMFYUI_PYTHON", sys.executable)
EXTRA_ARGS = shlex.split(os.environ.get("SSD_COMFYUI_ARGS", ""))  # more server flags (make test-host: --enable-manager)
API_DIR = ROOT / "tests" / "workflows_api"


def comfy_missing():
    if not COMFY_DIR:
        return "set SSD_COMFYUI_DIR to a ComfyUI checkout (and SSD_COMFYUI_PYTHON to its interpreter) to run"
    if not (Path(COMFY_DIR) / "main.py").is_file():
        return f"SSD_COMFYUI_DIR={COMFY_DIR} has no main.py"
    try:
        import requests  # noqa: F401
        import websocket  # noqa: F401
    except ImportError as e:
        return f"the test needs requests and websocket-client in the pytest interpreter ({e})"
    return None


def bundled_missing():
    ref = Path(os.environ.get("SSD_COMFYUI_PACK", ROOT)) / "ssd_core" / "reference" / "model"
    if not (ref / "config.json").is_file():
        return f"the bundled reference model is absent ({ref}/config.json)"
    if not (ref / "heads.safetensors").is_file():
        return f"the bundled heads are absent ({ref}/heads.safetensors): the example workflow needs them"
    return None


pytestmark = pytest.mark.skipif(comfy_missing() is not None, reason=str(comfy_missing()))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    """One ComfyUI process with this pack; HTTP and websocket helpers."""

    def __init__(self, comfy_dir=COMFY_DIR, python=COMFY_PY, pack=None, front_end_root=None):
        self.comfy_dir = Path(comfy_dir)
        self.front_end_root = front_end_root  # another frontend's static folder (--front-end-root); None = pinned
        self.python = python
        self.pack = Path(pack or os.environ.get("SSD_COMFYUI_PACK") or ROOT).resolve()
        self.base = Path(tempfile.mkdtemp(prefix="ssd-comfy-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client_id = uuid.uuid4().hex
        self.proc = None
        self.log_path = self.base / "server.log"

    # -- process ---------------------------------------------------------------------------
    def start(self, timeout=240):
        import requests

        (self.base / "custom_nodes").mkdir(parents=True)
        os.symlink(self.pack, self.base / "custom_nodes" / PACK_NAME)
        heads = self.base / "models" / "ssd_heads"
        heads.mkdir(parents=True)
        (heads / "broken.safetensors").write_bytes(b"not a safetensors file, on purpose " * 20)
        (self.base / "output").mkdir()
        cmd = [self.python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
               "--base-directory", str(self.base), "--output-directory", str(self.base / "output"),
               "--disable-auto-launch", "--database-url", "sqlite:///:memory:"]
        if self.front_end_root:
            cmd += ["--front-end-root", str(self.front_end_root)]
        cmd += EXTRA_ARGS
        self.log = open(self.log_path, "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # The bundled model is tiny: one thread is fast, and on a busy small machine torch's default
        # (one thread per core) is 20x slower from oversubscription. Set OMP_NUM_THREADS to override.
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(cmd, cwd=self.comfy_dir, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/object_info/SSDSampler", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"ComfyUI did not serve the pack within {timeout}s:\n{self.log_tail()}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "log", None):
            self.log.close()

    def cleanup(self):
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, n=60):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # -- HTTP ------------------------------------------------------------------------------
    def get(self, path, **kw):
        import requests

        r = requests.get(self.url + path, timeout=kw.pop("timeout", 30), **kw)
        r.raise_for_status()
        return r

    def post(self, path, data=None):
        import requests

        return requests.post(self.url + path, json=data, timeout=30)

    def ws(self):
        import websocket

        sock = websocket.create_connection(f"ws://127.0.0.1:{self.port}/ws?clientId={self.client_id}", timeout=5)
        return sock

    def queue(self, prompt):
        r = self.post("/prompt", {"prompt": prompt, "client_id": self.client_id})
        body = r.json()
        if r.status_code != 200:
            raise AssertionError(f"/prompt refused the prompt: {json.dumps(body)[:2000]}")
        return body["prompt_id"]

    def run(self, prompt, timeout=600, on_message=None):
        """Queue a prompt and collect its websocket messages until it succeeds, fails or stops."""
        sock = self.ws()
        try:
            pid = self.queue(prompt)
            msgs = []
            deadline = time.time() + timeout
            while time.time() < deadline:
                try:
                    raw = sock.recv()
                except Exception as e:  # websocket timeout: poll again
                    if type(e).__name__ == "WebSocketTimeoutException":
                        continue
                    raise
                if isinstance(raw, bytes):
                    msgs.append({"type": "binary", "data": raw})
                    continue
                msg = json.loads(raw)
                data = msg.get("data") or {}
                if data.get("prompt_id") not in (None, pid):
                    continue
                msgs.append(msg)
                if on_message:
                    on_message(msg)
                t = msg["type"]
                if t in ("execution_error", "execution_interrupted", "execution_success"):
                    return pid, msgs
                if t == "executing" and data.get("node") is None and data.get("prompt_id") == pid:
                    return pid, msgs
            raise AssertionError(f"prompt {pid} did not finish within {timeout}s:\n{self.log_tail()}")
        finally:
            sock.close()

    def history(self, pid):
        for _ in range(50):
            h = self.get(f"/history/{pid}").json()
            if pid in h:
                return h[pid]
            time.sleep(0.1)
        raise AssertionError(f"/history has no entry for {pid}")


def api_workflow(name="SSD Bundled 24x24 model - ar vs ssd-exact vs ssd"):
    return json.loads((API_DIR / f"{name}.json").read_text())


SMALL_GRID = "8x8 (32x32 px, 1:1) reference"  # an entry of the sampler's grid list


def small_prompt(seed=7, grid=SMALL_GRID, decoder="ssd", heads="reference", prompt="face"):
    """Loader -> heads -> one sampler on a small grid (the sampler is an output node): a cheap run."""
    wf = api_workflow()
    small = {k: wf[k] for k in ("1", "2", "4")}
    small["4"]["inputs"].update(seed=seed, grid=grid, decoder=decoder, prompt=prompt)
    small["2"]["inputs"]["heads"] = heads
    return small


def types_of(msgs):
    return [m["type"] for m in msgs]


@pytest.fixture(scope="module")
def server():
    srv = ComfyServer()
    srv.start()
    yield srv
    srv.stop()
    srv.cleanup()


# ---- tests --------------------------------------------------------------------------------------------------
def combo(spec):
    """The entries of a list input as ComfyUI serves a V3 node's: ["COMBO", {"options": [...], ...}]."""
    assert spec[0] == "COMBO", f"not a V3 list input: {spec!r}"
    return spec[1]["options"]


def test_object_info_lists_the_nodes(server):
    info = server.get("/object_info").json()
    for name, display in (("SSDLoadModel", "Load AR Image Model (SSD)"), ("SSDLoadHeads", "Load SSD Heads"),
                          ("SSDSampler", "SSD Sampler"), ("SSDTraceToImage", "SSD Trace to Image")):
        assert name in info, f"{name} missing from /object_info:\n{server.log_tail()}"
        assert info[name]["display_name"] == display
        assert info[name]["category"] == "sampling/SSD"
        assert info[name]["python_module"].endswith(PACK_NAME)
    model = info["SSDLoadModel"]["input"]["required"]
    assert combo(model["model"])[:2] == ["reference", "reference-48"]  # "COMBO": built from the V3 schema
    assert combo(model["dtype"]) == ["auto", "float32", "bfloat16", "float16"]
    assert combo(model["device"]) == ["auto", "cpu", "cuda", "mps"]
    heads = info["SSDLoadHeads"]["input"]["required"]
    assert combo(heads["heads"]) == ["reference", "reference-48", "none", "broken.safetensors"]  # models/ssd_heads
    assert heads["ssd_model"] == ["SSD_MODEL", {}]
    s = info["SSDSampler"]
    req = s["input"]["required"]
    assert list(req) == ["ssd_model", "prompt", "seed", "cfg", "temperature", "top_k", "top_p",
                         "decoder", "draft_rows", "verify_rounds", "grid"]
    assert list(s["input"]["optional"]) == ["negative_prompt", "batch_size", "min_p", "official_suffix"]
    assert s["input_order"]["required"] == list(req)
    assert combo(req["decoder"]) == ["ar", "ssd", "ssd-exact", "sjd", "zipar", "scd", "sjd-pac", "gsd", "flashar"]
    assert req["decoder"][1]["default"] == "ssd-exact"
    grids = combo(req["grid"])
    assert grids[0] == "auto" and SMALL_GRID in grids and "24x24 (384x384 px, 1:1) janus" in grids
    assert list(info["SSDLoadModel"]["input"]["optional"]) == ["quantization", "offload", "compile"]
    assert list(info["SSDLoadHeads"]["input"]["optional"]) == ["hub_repo", "hub_file", "download"]
    assert req["seed"][1]["control_after_generate"] is True and req["seed"][1]["max"] == 2**64 - 1
    assert req["prompt"][0] == "STRING" and req["prompt"][1]["multiline"] is True
    assert s["output"] == ["IMAGE", "SSD_TRACE", "STRING"]
    assert s["output_name"] == ["image", "trace", "stats"]
    assert s["output_node"] is True and s["input"]["hidden"]["unique_id"] == ["UNIQUE_ID"]
    t = info["SSDTraceToImage"]
    assert t["input"]["required"]["trace"] == ["SSD_TRACE", {}] and t["output"] == ["IMAGE"]
    assert "IMPORT FAILED" not in server.log_tail(400)


def test_object_info_matches_the_pack_outside_comfyui(server):
    """ComfyUI's entry for each node (built by comfy_api from the V3 schema) equals the one the pack's stand-in
    builds outside ComfyUI, which the tests without a server check: the stand-in does not drift from ComfyUI."""
    import comfy_stand_in
    from conftest import load_pack

    nodes = load_pack()
    assert nodes.io is comfy_stand_in.io
    info = server.get("/object_info").json()
    for name, cls in nodes.NODES.items():
        ours = json.loads(json.dumps(cls.GET_NODE_INFO_V1()))
        theirs = dict(info[name])
        # fields a newer core adds (0.30.0: is_input_list, dev_only, price_badge, ...): the pack sets none of them
        newer = {key: theirs.pop(key) for key in list(theirs) if key not in ours}
        assert not any(newer.values()), (name, newer)
        for entry in (ours, theirs):
            entry.pop("python_module")
            req = entry["input"]["required"]
            for key in ("model", "heads"):  # the lists of the user's folders differ: this server has its own
                if key in req:
                    req[key][1].pop("options")
        assert theirs == ours, name


@pytest.mark.skipif("--enable-manager" not in EXTRA_ARGS, reason="the server runs without the Manager "
                    "(make test-host starts it with --enable-manager, SSD_COMFYUI_ARGS)")
def test_the_manager_lists_the_pack(server):
    """Started with --enable-manager (ComfyUI 0.30.0 and newer), the Manager counts the pack as installed and
    enabled; when the pack is a git clone (cm-cli's install), at the commit it was cloned at."""
    installed = server.get("/v2/customnode/installed").json()
    assert PACK_NAME in installed and installed[PACK_NAME]["enabled"] is True, installed
    head = subprocess.run(["git", "-C", str(server.pack), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and (server.pack / ".git").exists():
        assert installed[PACK_NAME]["ver"] == head.stdout.strip(), installed
    assert "IMPORT FAILED" not in server.log_tail(400)


def test_widget_and_templates_are_served(server):
    exts = server.get("/extensions").json()
    assert f"/extensions/{PACK_NAME}/ssd_grid.js" in exts
    assert f"/extensions/{PACK_NAME}/ssd_grid_core.js" in exts
    assert "registerExtension" in server.get(f"/extensions/{PACK_NAME}/ssd_grid.js").text
    # in name order whatever the directory's order (ext4's is a hash order: Janus-Pro 7B came first here)
    for path in ("/workflow_templates", "/api/workflow_templates"):
        listed = server.get(path).json()[PACK_NAME]
        assert listed == sorted(listed, key=str.casefold) and len(listed) == 8, listed
        assert listed[0] == "SSD Bundled 24x24 model - ar vs ssd-exact vs ssd"
    wf = server.get(f"/api/workflow_templates/{PACK_NAME}/SSD Bundled 24x24 model - ar vs ssd-exact vs ssd.json").json()
    assert {n["type"] for n in wf["nodes"]} >= {"SSDLoadModel", "SSDSampler"}
    thumb = server.get(f"/api/workflow_templates/{PACK_NAME}/SSD Bundled 24x24 model - ar vs ssd-exact vs ssd.jpg").content
    assert thumb[:3] == b"\xff\xd8\xff"


def test_every_api_workflow_validates(server):
    """The family workflows only miss the user's downloads; everything else validates."""
    info = server.get("/object_info").json()
    for path in sorted(API_DIR.glob("*.json")):
        wf = json.loads(path.read_text())
        for nid, node in wf.items():
            assert node["class_type"] in info, f"{path.name}: node {nid} {node['class_type']} unknown to ComfyUI"


@pytest.mark.skipif(bundled_missing() is not None, reason=str(bundled_missing()))
def test_reference_workflow_runs(server):
    wf = api_workflow()
    pid, msgs = server.run(wf)
    kinds = types_of(msgs)
    assert "execution_error" not in kinds, json.dumps([m for m in msgs if m["type"] == "execution_error"])[:3000]
    assert "execution_success" in kinds
    grid_events = [m["data"] for m in msgs if m["type"] == "ssd.grid"]
    assert {e["node"] for e in grid_events} == {"3", "4", "5"}, "live ssd.grid events from all three samplers"
    assert any(e["done"] is False for e in grid_events) and any(e["done"] is True for e in grid_events)
    progress = [m["data"] for m in msgs if m["type"] == "progress" and m["data"].get("node") in ("3", "4", "5")]
    assert progress and progress[-1]["value"] == progress[-1]["max"]
    previews = [m["data"] for m in msgs if m["type"] == "binary" and b"\xff\xd8\xff" in m["data"]]
    assert previews, "no preview image was sent"

    h = server.history(pid)
    assert h["status"]["status_str"] == "success"
    out = h["outputs"]
    for nid in ("3", "4", "5"):
        tr = out[nid]["ssd_trace"][0]
        H, W = tr["grid"]
        assert len(tr["status"]) == H * W and tr["done"] is True and tr["steps"] > 0
    assert [out[n]["ssd_trace"][0]["decoder"] for n in ("3", "4", "5")] == ["ar", "ssd-exact", "ssd"]
    # the live preview shows the picture at its real size (ComfyUI fits a preview to the size the node gives)
    from PIL import Image

    saved = out["6"]["images"][0]
    picture = Image.open(io.BytesIO(server.get("/view", params=saved).content)).size
    shown = {Image.open(io.BytesIO(raw[raw.index(b"\xff\xd8\xff"):])).size for raw in previews}
    assert shown == {picture}, f"previews {shown} for a {picture} picture"
    for nid in ("4", "5"):
        assert out[nid]["ssd_trace"][0]["steps"] < out["3"]["ssd_trace"][0]["steps"]
    assert "2" in out["5"]["ssd_trace"][0]["status"], "no accepted draft in the ssd run"
    for nid in ("6", "7", "8"):  # the three SaveImage nodes
        img = out[nid]["images"][0]
        data = server.get("/view", params={"filename": img["filename"], "subfolder": img["subfolder"],
                                           "type": img["type"]}).content
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
    saved = sorted(p.name for p in (server.base / "output" / "ssd_reference").glob("*.png"))
    assert any(n.startswith("ar_") for n in saved) and any(n.startswith("ssd_") for n in saved)
    assert "tokens per step" in out["10"]["text"][0]

    # the same prompt again: cached, and the widget still gets its trace
    pid2, msgs2 = server.run(wf)
    executed = {m["data"]["node"]: m["data"]["output"] for m in msgs2 if m["type"] == "executed"}
    assert "ssd_trace" in (executed.get("4") or {}), "a cached sampler must resend its trace"


@pytest.mark.skipif(bundled_missing() is not None, reason=str(bundled_missing()))
def test_interrupt_stops_a_run_and_the_next_runs(server):
    wf = api_workflow()
    for nid in ("3", "4"):
        wf[nid]["inputs"]["seed"] = 1000 + int(time.time()) % 100000  # not cached
    wf["3"]["inputs"]["grid"] = "auto"
    sent = []

    def on_message(msg):
        if msg["type"] == "ssd.grid" and not sent:
            sent.append(server.post("/interrupt").status_code)

    pid, msgs = server.run(wf, on_message=on_message)
    assert sent == [200]
    kinds = types_of(msgs)
    assert "execution_interrupted" in kinds, kinds[-10:]
    assert "execution_success" not in kinds
    h = server.history(pid)
    assert h["status"]["status_str"] == "error"
    pid, msgs = server.run(small_prompt(seed=11))
    assert "execution_success" in types_of(msgs)


def test_bad_heads_file_gives_an_error_and_the_server_goes_on(server):
    wf = api_workflow()
    wf["2"]["inputs"]["heads"] = "broken.safetensors"
    pid, msgs = server.run(wf)
    errors = [m["data"] for m in msgs if m["type"] == "execution_error"]
    assert errors, types_of(msgs)
    err = errors[0]
    assert err["node_type"] == "SSDLoadHeads" and err["node_id"] == "2"
    assert err["exception_message"].strip(), "the error dialog needs a message"
    assert server.get("/system_stats").status_code == 200
    if bundled_missing() is None:
        pid, msgs = server.run(small_prompt(seed=12))
        assert "execution_success" in types_of(msgs)


@pytest.mark.skipif(bundled_missing() is not None, reason=str(bundled_missing()))
def test_bad_prompt_message_reaches_the_error_dialog(server):
    pid, msgs = server.run(small_prompt(prompt="a class that does not exist"))
    errors = [m["data"] for m in msgs if m["type"] == "execution_error"]
    assert errors and errors[0]["node_type"] == "SSDSampler" and errors[0]["node_id"] == "4"
    assert "is not a class of this model" in errors[0]["exception_message"]
    assert "face" in errors[0]["exception_message"]


def test_family_workflows_only_miss_their_downloads(server):
    """Saved before the V3 nodes, the family workflows still validate in every input but the downloads."""
    checked = 0
    for path in sorted(API_DIR.glob("*.json")):
        if path.stem.startswith("SSD Bundled"):  # the bundled models' templates need no download
            continue
        r = server.post("/prompt", {"prompt": json.loads(path.read_text()), "client_id": server.client_id})
        assert r.status_code == 400, path.name
        bad = {(node["class_type"], e["extra_info"]["input_name"])
               for node in r.json()["node_errors"].values() for e in node["errors"]}
        assert bad and bad <= {("SSDLoadModel", "model"), ("SSDLoadHeads", "heads")}, (path.name, bad)
        checked += 1
    families = [p for p in (ROOT / "example_workflows").glob("*.json") if not p.stem.startswith("SSD Bundled")]
    assert checked == len(families) > 0, "every family template has its API twin in tests/workflows_api"


def test_missing_model_folder_is_refused_before_running(server):
    wf = api_workflow("SSD Janus-Pro 7B - ar vs ssd-exact")
    r = server.post("/prompt", {"prompt": wf, "client_id": server.client_id})
    assert r.status_code == 400
    body = r.json()
    # ComfyUI 0.3.64 checks V3 list inputs only through the node's validate_inputs: the loader's says which
    errors = body["node_errors"]["1"]["errors"]
    assert [e["extra_info"]["input_name"] for e in errors] == ["model"], errors
    assert "model: 'Janus-Pro-7B' is not in the list (reference" in errors[0]["details"], errors


@pytest.mark.skipif(bundled_missing() is not None, reason=str(bundled_missing()))
def test_free_models_then_run_again(server):
    assert server.post("/free", {"unload_models": True, "free_memory": True}).status_code == 200
    time.sleep(1.0)
    pid, msgs = server.run(small_prompt(seed=4242))
    assert "execution_success" in types_of(msgs)
    assert any(m["type"] == "executed" and m["data"]["node"] == "4" for m in msgs)


@pytest.mark.skipif(bundled_missing() is not None, reason=str(bundled_missing()))
def test_comfyui_manages_the_model_and_free_releases_it(server):
    """The loaded model is in ComfyUI's loaded-models list (a ModelPatcher); POST /free unloads it and drops
    it (GET /ssd/models lists what the pack still holds); the next run loads it again."""
    def held(want, timeout=30):
        deadline = time.time() + timeout
        while True:
            models = server.get("/ssd/models").json()["models"]
            if want(models) or time.time() > deadline:
                return models
            time.sleep(0.5)

    pid, msgs = server.run(small_prompt(seed=31, decoder="ssd-exact", heads="none"))
    assert "execution_success" in types_of(msgs)
    models = held(lambda m: len(m) == 1)
    assert len(models) == 1 and models[0]["loaded_in_comfyui"] and models[0]["family"] == "llama-grid"
    # ComfyUI's prompt worker reads /free's flags only when it wakes: a /free that lands while it is still
    # finishing the last prompt (its gc) wakes nobody until the next prompt. Seen once here (make test-host, 2 busy
    # cores), so /free is posted again, as a user would press the button again, until the model is gone.
    deadline = time.time() + 60
    while True:
        assert server.post("/free", {"unload_models": True, "free_memory": True}).status_code == 200
        models = held(lambda m: not m, timeout=10)
        if not models or time.time() > deadline:
            break
    assert models == []
    pid, msgs = server.run(small_prompt(seed=32, decoder="ssd-exact", heads="none"))
    assert "execution_success" in types_of(msgs)
    models = held(lambda m: len(m) == 1)
    assert len(models) == 1 and models[0]["loaded_in_comfyui"]
