// web/ssd_grid.js on a stand-in node (no browser, no ComfyUI): the sampler is made large enough at once for
// every widget at its least height, the grid's included, so its first layout grows nothing (issue 41: the
// prompt box jumped when the grid widget first drew). Run with `node --test tests/js/`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { register } from "node:module";

// ssd_grid.js imports ComfyUI's app and api as "../../scripts/app.js" / "api.js": stand-ins answer for them.
const extensions = [];
globalThis.__ssdComfy = {
  app: { registerExtension: (e) => extensions.push(e) },
  api: { addEventListener() {} },
};
const hooks = `
export async function resolve(specifier, context, next) {
  for (const name of ["app", "api"]) {
    if (specifier.endsWith("/scripts/" + name + ".js")) {
      return { url: "data:text/javascript,export const " + name + " = globalThis.__ssdComfy." + name + ";",
               shortCircuit: true };
    }
  }
  return next(specifier, context);
}`;
register("data:text/javascript," + encodeURIComponent(hooks));

// the little of the DOM the widget touches while it is made
function element(tag) {
  return {
    tag, style: { cssText: "" }, className: "", title: "", textContent: "", clientWidth: 0, clientHeight: 0,
    children: [],
    append(...c) { this.children.push(...c); },
    addEventListener() {},
    getContext() { return null; },
    getBoundingClientRect() { return { left: 0, top: 0, width: 0, height: 0 }; },
  };
}
globalThis.document = { createElement: element };
globalThis.window = { devicePixelRatio: 1 };
globalThis.requestAnimationFrame = () => 0;

const SLOT = 20; // LiteGraph.NODE_SLOT_HEIGHT
const WIDGET = 20; // LiteGraph.NODE_WIDGET_HEIGHT
const DOM_LEAST = 50; // a DOM widget without a least height of its own (the multiline prompt boxes)

// A LiteGraph node as far as the widget uses it: widgets, DOM widgets, setSize, and computeSize as LiteGraph
// counts it (slot rows, then every widget at its least height plus a 4 px gap, plus 8).
class StandInNode {
  constructor() {
    this.type = "SSDSampler";
    this.properties = {};
    this.inputs = [{ name: "ssd_model" }];
    this.outputs = [{ name: "image" }, { name: "trace" }, { name: "stats" }];
    // the sampler's widgets (nodes/sampler.py): two prompt boxes, thirteen one-line widgets (seed's control too)
    this.widgets = [];
    this.addDOMWidget("prompt", "customtext", element("textarea"), {});
    for (const name of ["seed", "control_after_generate", "cfg", "temperature", "top_k", "top_p", "decoder",
      "draft_rows", "verify_rounds", "grid"]) this.widgets.push({ name, type: "number", value: 0 });
    this.addDOMWidget("negative_prompt", "customtext", element("textarea"), {});
    for (const name of ["batch_size", "min_p", "official_suffix"]) this.widgets.push({ name, type: "number", value: 0 });
    this.size = this.computeSize(); // what the frontend makes a node before onNodeCreated runs
  }

  addDOMWidget(name, type, el, options) {
    const w = { name, type, element: el, options,
      computeLayoutSize: () => ({ minHeight: options.getMinHeight?.() ?? DOM_LEAST, minWidth: 0 }) };
    this.widgets.push(w);
    return w;
  }

  computeSize() {
    let height = Math.max(this.inputs.length, this.outputs.length) * SLOT;
    for (const w of this.widgets) {
      const least = w.computeSize ? w.computeSize()[1] : w.computeLayoutSize ? w.computeLayoutSize(this).minHeight : WIDGET;
      height += least + 4;
    }
    return [300, height + 8];
  }

  setSize(size) {
    this.size = [size[0], size[1]];
  }
}

await import("../../web/ssd_grid.js");
const [extension] = extensions;
class Sampler extends StandInNode {}
extension.beforeRegisterNodeDef(Sampler, { name: "SSDSampler" });

test("the sampler is made with room for every widget and the grid's least height", () => {
  const node = new Sampler();
  node.onNodeCreated();
  const grid = node.widgets.find((w) => w.name === "ssd_grid");
  assert.ok(grid, "the grid widget is added when the node is made");
  assert.equal(grid.computeLayoutSize(node).minHeight, 300);
  const [needW, needH] = node.computeSize();
  assert.ok(needH > 700, `the widgets need ${needH} px: more than the old fixed 700`);
  assert.ok(node.size[1] >= needH && node.size[0] >= Math.max(needW, 380), `made ${node.size}, needs ${needW}x${needH}`);
  // the canvas's pixel size, set when it first draws, never sizes the box it sits in
  const canvas = grid.element.children.find((c) => c.tag === "canvas");
  assert.match(canvas.style.cssText, /position:absolute/);
});

test("a workflow saved with a smaller sampler is grown when it loads, not on its first layout", () => {
  const node = new Sampler();
  node.onNodeCreated();
  node.size = [380, 700]; // as configure() sets a size saved by an older version
  node.onConfigure({});
  assert.ok(node.size[1] >= node.computeSize()[1], `configured at ${node.size}`);
  const big = new Sampler();
  big.onNodeCreated();
  big.size = [400, 1000]; // the templates' size: kept
  big.onConfigure({});
  assert.deepEqual(big.size, [400, 1000]);
});

test("under the Vue node renderer an auto value says so in its label, and only while it is auto", () => {
  const settings = { "Comfy.VueNodes.Enabled": true };
  globalThis.__ssdComfy.app.extensionManager = { setting: { get: (id) => settings[id] } };
  try {
    const node = new Sampler();
    node.widgets.find((w) => w.name === "cfg").value = -1;
    node.widgets.find((w) => w.name === "seed").value = -1; // seed has no auto value
    node.onNodeCreated();
    const w = (name) => node.widgets.find((x) => x.name === name);
    assert.equal(w("cfg").label, "cfg \u00b7 auto");
    assert.equal(w("draft_rows").label, "draft_rows \u00b7 auto"); // draft_rows' auto is 0
    assert.equal(w("seed").label, undefined);
    w("cfg").value = 3;
    w("cfg").callback(3); // an edit, in either renderer
    assert.equal(w("cfg").label, "cfg");
    w("top_k").label = "k"; // a label someone else gave (or a translation) stays, "auto" beside it
    w("top_k").value = -1;
    w("cfg").value = -1;
    w("cfg").callback(-1);
    assert.equal(w("cfg").label, "cfg \u00b7 auto");
    assert.equal(w("top_k").label, "k \u00b7 auto");
    settings["Comfy.VueNodes.Enabled"] = false; // the canvas renderer draws "auto" as the value instead
    node.onConfigure({});
    assert.equal(w("cfg").label, "cfg");
    assert.equal(w("top_k").label, "k");
  } finally {
    delete globalThis.__ssdComfy.app.extensionManager;
  }
});
