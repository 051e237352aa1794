// The token-grid widget on the SSD Sampler node: live from "ssd.grid" events while sampling,
// final from the node's ui output ("executed"), and kept in node.properties across reloads.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import {
  draw, cellAt, normalizeTrace, hoverText, mergeBatch, batchFromOutput, selectedTrace, selectImage, batchLabel,
  autoText, AUTO_VALUES, AUTO_LABEL,
} from "./ssd_grid_core.js";

const NODE_TYPE = "SSDSampler";
const WIDGET = "ssd_grid";
const PROP = "ssd_trace"; // the shown trace
const BATCH_PROP = "ssd_batch"; // every image's trace of a batch run
const MIN_HEIGHT = 300;
const NODE_SIZE = [380, 700]; // the sampler's size when made, at least (more when its widgets need more)

function widgetOf(node) {
  return node?.widgets?.find((w) => w.name === WIDGET) ?? null;
}

// The sampler node of an execution id: "4" at the top level, "12:4" for node 4 inside the subgraph node 12
// (frontend >= 1.24), nested as deep as the subgraphs go. Falls back to the graph on screen.
function findNode(id) {
  if (id === null || id === undefined) return null;
  const byId = (graph, key) => graph?.getNodeById?.(Number(key)) ?? graph?.getNodeById?.(key) ?? null;
  const parts = String(id).split(":");
  let graph = app.graph;
  let node = null;
  for (let i = 0; i < parts.length && graph; i++) {
    node = byId(graph, parts[i]);
    graph = i < parts.length - 1 ? node?.subgraph : null;
  }
  if ((!node || node.type !== NODE_TYPE) && parts.length > 1) node = byId(app.canvas?.graph, parts[parts.length - 1]);
  return node && node.type === NODE_TYPE ? node : null;
}

// Tell the frontend the graph changed (the trace now sits in node.properties), so that the open
// workflow is persisted with it and a page reload shows the grid again. captureCanvasState() since
// frontend 1.58 (where checkState() is deprecated and warns); checkState() before it.
function saveWorkflowState() {
  try {
    const tracker = app.extensionManager?.workflow?.activeWorkflow?.changeTracker;
    if (typeof tracker?.captureCanvasState === "function") tracker.captureCanvasState();
    else tracker?.checkState?.();
  } catch (e) {
    console.debug("ssd grid: could not record the trace in the workflow", e);
  }
}

// Where a prototype (a LiteGraph widget class, frontend >= 1.16) defines the getter `name`, or null.
function getterOf(object, name) {
  for (let p = Object.getPrototypeOf(object); p; p = Object.getPrototypeOf(p)) {
    const d = Object.getOwnPropertyDescriptor(p, name);
    if (d) return typeof d.get === "function" ? d.get : null;
  }
  return null;
}

// The canvas draws a widget's _displayValue: the sampler's "model default" values read "auto" there, the value
// itself (saved in the workflow, sent to the server) stays the number. A frontend without the getter (or the
// Vue node renderer, which draws its own inputs) shows the number.
function showAuto(node) {
  for (const w of node.widgets ?? []) {
    const text = getterOf(w, "_displayValue");
    if (!text || !Object.hasOwn(AUTO_VALUES, w.name)) continue;
    Object.defineProperty(w, "_displayValue", {
      configurable: true,
      get() {
        return (!this.computedDisabled && autoText(this.name, this.value)) || text.call(this);
      },
    });
  }
}

// The Vue node renderer (Nodes 2.0, the setting below) draws its own number inputs, which show the number: there
// a "model default" value says "auto" in its label instead ("cfg \u00b7 auto"), kept in step with the value (the
// widget's callback runs on every edit in both renderers; a loaded workflow's values are read in onConfigure; the
// setting's change relabels every sampler). The label itself (the name, a translation, one a user gave) stays.
const VUE_NODES = "Comfy.VueNodes.Enabled";

function vueNodes() {
  try {
    const settings = app.extensionManager?.setting; // frontend >= 1.3; the deprecated dialog's getter before it
    return (settings?.get ? settings.get(VUE_NODES) : app.ui?.settings?.getSettingValue?.(VUE_NODES)) === true;
  } catch {
    return false;
  }
}

function labelAuto(node) {
  for (const w of node.widgets ?? []) {
    if (!Object.hasOwn(AUTO_VALUES, w.name)) continue;
    const own = w.label ?? w.name; // the frontend's label (the name, or a translation), or one a user gave
    const base = own.endsWith(AUTO_LABEL) ? own.slice(0, -AUTO_LABEL.length) : own;
    const label = vueNodes() && autoText(w.name, w.value) ? base + AUTO_LABEL : base;
    if (label !== own) w.label = label;
  }
}

function relabelOnEdit(node) {
  for (const w of node.widgets ?? []) {
    if (!Object.hasOwn(AUTO_VALUES, w.name) || w.ssdRelabels) continue;
    const callback = w.callback;
    w.callback = function () {
      const r = callback?.apply(this, arguments);
      labelAuto(node);
      return r;
    };
    w.ssdRelabels = true;
  }
  labelAuto(node);
}

function samplers(graph = app.graph, found = []) {
  for (const node of graph?._nodes ?? graph?.nodes ?? []) {
    if (node.type === NODE_TYPE) found.push(node);
    if (node.subgraph) samplers(node.subgraph, found);
  }
  return found;
}

function addGridWidget(node) {
  if (widgetOf(node)) return widgetOf(node);
  const box = document.createElement("div");
  box.className = "ssd-grid-widget";
  box.style.cssText = "width:100%;height:100%;min-height:" + MIN_HEIGHT + "px;position:relative;";
  // the image selector of a batch: hidden for a single image
  const bar = document.createElement("div");
  bar.className = "ssd-grid-batch";
  bar.style.cssText = "display:none;position:absolute;top:4px;right:6px;gap:4px;align-items:center;" +
    "font:12px sans-serif;color:#ddd;background:rgba(20,20,20,0.8);padding:2px 4px;border-radius:4px;z-index:1;";
  const button = (text, title) => {
    const b = document.createElement("button");
    b.textContent = text;
    b.title = title;
    b.style.cssText = "font:12px sans-serif;padding:0 6px;cursor:pointer;";
    return b;
  };
  const prev = button("\u25C0", "previous image of the batch");
  const next = button("\u25B6", "next image of the batch");
  const label = document.createElement("span");
  bar.append(prev, label, next);
  const canvas = document.createElement("canvas");
  // absolute: the canvas's pixel size (set when it draws) never feeds back into the box's height
  canvas.style.cssText = "position:absolute;inset:0;width:100%;height:100%;display:block;";
  box.append(bar, canvas);

  const state = { batch: null, trace: null, hover: null, pending: false };

  const redraw = () => {
    state.pending = false;
    const w = Math.max(1, Math.floor(box.clientWidth));
    const h = Math.max(1, Math.floor(box.clientHeight));
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.floor(w * dpr) || canvas.height !== Math.floor(h * dpr)) {
      canvas.width = Math.floor(w * dpr);
      canvas.height = Math.floor(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    if (!ctx) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    state.layout = draw(ctx, state.trace, w, h, state.hover);
  };
  const showBatch = () => {
    state.trace = selectedTrace(state.batch);
    const text = batchLabel(state.batch);
    label.textContent = text;
    bar.style.display = text ? "flex" : "none";
  };
  const schedule = () => {
    if (state.pending) return;
    state.pending = true;
    requestAnimationFrame(redraw);
  };

  canvas.addEventListener("mousemove", (e) => {
    const r = canvas.getBoundingClientRect();
    const sx = box.clientWidth / (r.width || 1);
    const sy = box.clientHeight / (r.height || 1);
    const cell = cellAt(state.layout, (e.clientX - r.left) * sx, (e.clientY - r.top) * sy);
    const same = cell && state.hover && cell.index === state.hover.index;
    if (!same && (cell || state.hover)) {
      state.hover = cell;
      canvas.title = cell ? hoverText(state.trace, cell) : "";
      schedule();
    }
  });
  const pick = (delta) => (e) => {
    e.stopPropagation();
    state.batch = selectImage(state.batch, delta);
    showBatch();
    if (state.trace?.done) node.properties[PROP] = state.trace;
    schedule();
  };
  prev.addEventListener("click", pick(-1));
  next.addEventListener("click", pick(1));
  canvas.addEventListener("mouseleave", () => {
    if (state.hover) {
      state.hover = null;
      schedule();
    }
  });

  const widget = node.addDOMWidget(WIDGET, "ssd-grid", box, {
    serialize: false,
    hideOnZoom: false,
    getMinHeight: () => MIN_HEIGHT,
    getValue: () => "",
    setValue: () => {},
  });
  widget.serialize = false;
  widget.computeLayoutSize = () => ({ minHeight: MIN_HEIGHT, minWidth: 280 });
  widget.ssd = {
    state,
    schedule,
    // one trace (a live event or a saved trace) or a list (the node's output: one per image)
    set(incoming, persist) {
      const next = Array.isArray(incoming) ? batchFromOutput(state.batch, incoming) : mergeBatch(state.batch, incoming);
      if (next === state.batch) return;
      state.batch = next;
      showBatch();
      if (persist && state.trace?.done) {
        node.properties[PROP] = state.trace;
        if (next.traces.length > 1) node.properties[BATCH_PROP] = next.traces;
        else delete node.properties[BATCH_PROP];
        saveWorkflowState();
      }
      schedule();
    },
    select(index) {
      state.batch = selectImage(state.batch, index, true);
      showBatch();
      schedule();
    },
  };
  if (typeof ResizeObserver !== "undefined") new ResizeObserver(schedule).observe(box);
  schedule();
  return widget;
}

// The node made large enough at once for every widget at its least height, the grid's included (LiteGraph's
// computeSize counts a DOM widget's computeLayoutSize): a node smaller than that grows on its first layout, so
// the prompt box and everything below it jumped when the grid widget first drew.
function reserveRoom(node, least = [0, 0]) {
  const [w, h] = node.size ?? [0, 0];
  const [needW, needH] = node.computeSize?.() ?? [0, 0];
  const width = Math.max(w || 0, least[0], needW || 0);
  const height = Math.max(h || 0, least[1], needH || 0);
  if (width !== w || height !== h) node.setSize?.([width, height]);
}

app.registerExtension({
  name: "comfyui-ssd.grid",
  beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name !== NODE_TYPE) return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      addGridWidget(this); // node.widgets may not exist yet: addDOMWidget makes it
      showAuto(this);
      relabelOnEdit(this);
      reserveRoom(this, NODE_SIZE);
      return r;
    };
    const onConfigure = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function (info) {
      const r = onConfigure?.apply(this, arguments);
      if (!widgetOf(this)) addGridWidget(this); // a frontend that configures before onNodeCreated ran
      relabelOnEdit(this); // the loaded values
      reserveRoom(this); // a workflow saved with a smaller node: grown now, not on its first layout
      const batch = this.properties?.[BATCH_PROP];
      const saved = normalizeTrace(this.properties?.[PROP]);
      if (Array.isArray(batch) && batch.length > 1) widgetOf(this)?.ssd?.set(batch, false);
      else if (saved) widgetOf(this)?.ssd?.set(saved, false);
      return r;
    };
  },
  setup() {
    app.ui?.settings?.addEventListener?.(VUE_NODES + ".change", () => {
      // after the setting's store holds the new value
      setTimeout(() => samplers().forEach(labelAuto));
    });
    api.addEventListener("ssd.grid", (e) => {
      const node = findNode(e.detail?.node);
      widgetOf(node)?.ssd?.set(e.detail, e.detail?.done === true);
    });
    api.addEventListener("executed", (e) => {
      const d = e.detail;
      const traces = d?.output?.ssd_trace;
      if (!Array.isArray(traces) || traces.length === 0) return;
      const node = findNode(d.display_node ?? d.node) ?? findNode(d.node);
      widgetOf(node)?.ssd?.set(traces, true);
    });
  },
});
