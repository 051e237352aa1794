// The token-grid widget on the SSD Sampler node: live from "ssd.grid" events while sampling,
// final from the node's ui output ("executed"), and kept in node.properties across reloads.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { draw, cellAt, mergeTrace, normalizeTrace, hoverText } from "./ssd_grid_core.js";

const NODE_TYPE = "SSDSampler";
const WIDGET = "ssd_grid";
const PROP = "ssd_trace";
const MIN_HEIGHT = 300;

function widgetOf(node) {
  return node?.widgets?.find((w) => w.name === WIDGET) ?? null;
}

function findNode(id) {
  if (id === null || id === undefined) return null;
  const graph = app.graph;
  if (!graph) return null;
  const s = String(id);
  let node = graph.getNodeById(Number(s)) ?? graph.getNodeById(s);
  if (!node && s.includes(":")) {
    const inner = app.canvas?.graph;
    node = inner?.getNodeById?.(Number(s.split(":").pop())) ?? null;
  }
  return node && node.type === NODE_TYPE ? node : null;
}

// Tell the frontend the graph changed (the trace now sits in node.properties), so that the open
// workflow is persisted with it and a page reload shows the grid again.
function saveWorkflowState() {
  try {
    app.extensionManager?.workflow?.activeWorkflow?.changeTracker?.checkState?.();
  } catch (e) {
    console.debug("ssd grid: could not record the trace in the workflow", e);
  }
}

function addGridWidget(node) {
  if (widgetOf(node)) return widgetOf(node);
  const box = document.createElement("div");
  box.className = "ssd-grid-widget";
  box.style.cssText = "width:100%;height:100%;min-height:" + MIN_HEIGHT + "px;position:relative;";
  const canvas = document.createElement("canvas");
  canvas.style.cssText = "width:100%;height:100%;display:block;";
  box.appendChild(canvas);

  const state = { trace: null, hover: null, pending: false };

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
    set(trace, persist) {
      const next = mergeTrace(state.trace, trace);
      if (next === state.trace) return;
      state.trace = next;
      if (persist && next?.done) {
        node.properties[PROP] = next;
        saveWorkflowState();
      }
      schedule();
    },
  };
  if (typeof ResizeObserver !== "undefined") new ResizeObserver(schedule).observe(box);
  schedule();
  return widget;
}

app.registerExtension({
  name: "comfyui-ssd.grid",
  beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name !== NODE_TYPE) return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      addGridWidget(this);
      const [w, h] = this.size;
      this.setSize([Math.max(w, 380), Math.max(h, 700)]);
      return r;
    };
    const onConfigure = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function (info) {
      const r = onConfigure?.apply(this, arguments);
      const saved = normalizeTrace(this.properties?.[PROP]);
      if (saved) widgetOf(this)?.ssd?.set(saved, false);
      return r;
    };
  },
  setup() {
    api.addEventListener("ssd.grid", (e) => {
      const node = findNode(e.detail?.node);
      widgetOf(node)?.ssd?.set(e.detail, e.detail?.done === true);
    });
    api.addEventListener("executed", (e) => {
      const d = e.detail;
      const trace = d?.output?.ssd_trace?.[0];
      if (!trace) return;
      const node = findNode(d.display_node ?? d.node) ?? findNode(d.node);
      widgetOf(node)?.ssd?.set(trace, true);
    });
  },
});
