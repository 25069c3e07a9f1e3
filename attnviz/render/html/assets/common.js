// attnviz page helpers shared by the full page (view.js) and row mode (rows.js): the colour
// map, the canvas helpers, the tooltip, the header's sentence, provenance and legend, the head
// chips and the view tabs. html.py inlines this file before each page's script, in the same
// <script> element, so each page stays one self-contained file. Requests nothing from any
// network. What differs between the pages comes in as arguments.
var attnvizCommon = (function () {
  "use strict";

  var $ = function (id) { return document.getElementById(id); };

  // --- colour --------------------------------------------------------------------------
  var VIRIDIS = ["#440154", "#48186a", "#472d7b", "#424086", "#3b528b", "#33638d", "#2c728e",
    "#26828e", "#21918c", "#1fa088", "#28ae80", "#3fbc73", "#5ec962", "#84d44b", "#addc30",
    "#d8e219", "#fde725"]; // matplotlib's viridis at 17 even stops
  var MASKED = [208, 208, 208];
  var LUT = (function () { // 256 RGB triples, linear between the stops
    var stops = VIRIDIS.map(function (h) {
      return [parseInt(h.slice(1, 3), 16), parseInt(h.slice(3, 5), 16), parseInt(h.slice(5, 7), 16)];
    });
    var lut = [];
    for (var i = 0; i < 256; i++) {
      var x = i / 255 * (stops.length - 1), k = Math.min(Math.floor(x), stops.length - 2), f = x - k;
      lut.push([0, 1, 2].map(function (c) { return Math.round(stops[k][c] + f * (stops[k + 1][c] - stops[k][c])); }));
    }
    return lut;
  })();
  function rgb(w) { return LUT[Math.max(0, Math.min(255, Math.round(w * 255)))]; }
  function css(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }

  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#7b4173", "#e7ba52", "#3182bd"];
  function headColour(h) { // a head's line colour; "mean" and "rollout" (full page only) have their own
    if (h === "mean") return "#222";
    if (h === "rollout") return "#7a0177";
    return h < PALETTE.length ? PALETTE[h] : "hsl(" + Math.round((h * 137.508) % 360) + ",65%,45%)";
  }

  // --- canvas helpers ------------------------------------------------------------------
  var FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
  function sized(canvas, w, h) { // CSS size w × h, sharp on high-density screens
    var r = window.devicePixelRatio || 1;
    canvas.width = Math.max(1, Math.round(w * r));
    canvas.height = Math.max(1, Math.round(h * r));
    canvas.style.width = w + "px";
    canvas.style.height = h + "px";
    var ctx = canvas.getContext("2d");
    ctx.setTransform(r, 0, 0, r, 0, 0);
    return ctx;
  }
  function textWidth(ctx, labels) {
    var w = 0;
    for (var i = 0; i < labels.length; i++) w = Math.max(w, ctx.measureText(labels[i]).width);
    return w;
  }
  // An (rows × cols) heatmap as an image, drawn at (x, y) with cells cw × ch.
  function heatmap(ctx, values, rows, cols, x, y, cw, ch, maskFn) {
    var img = document.createElement("canvas");
    img.width = cols; img.height = rows;
    var ictx = img.getContext("2d"), data = ictx.createImageData(cols, rows);
    for (var r = 0; r < rows; r++) {
      for (var c = 0; c < cols; c++) {
        var col = maskFn && maskFn(r, c) ? MASKED : rgb(values[r * cols + c]), p = 4 * (r * cols + c);
        data.data[p] = col[0]; data.data[p + 1] = col[1]; data.data[p + 2] = col[2]; data.data[p + 3] = 255;
      }
    }
    ictx.putImageData(data, 0, 0);
    // Upscaled: sharp cells. Downscaled (a thumbnail of a long sentence): smoothing averages
    // the cells that share a pixel instead of dropping all but one.
    ctx.imageSmoothingEnabled = cw < 1 || ch < 1;
    ctx.imageSmoothingQuality = "high";
    ctx.drawImage(img, x, y, cols * cw, rows * ch);
  }

  // --- tooltip (#tip) ------------------------------------------------------------------
  function showTip(ev, text) {
    var tip = $("tip");
    tip.textContent = text;
    tip.hidden = false;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + tip.offsetWidth > window.innerWidth - 4) x = ev.clientX - tip.offsetWidth - 10;
    tip.style.left = x + window.scrollX + "px";
    tip.style.top = y + window.scrollY + "px";
  }
  function hideTip() { $("tip").hidden = true; }
  function fmt(w) { return w.toFixed(3); }

  // --- header --------------------------------------------------------------------------
  // #sentence: the text in quotes; a long one (clamp) is clamped to two lines, and a click
  // (or Enter) toggles the clamp; title says what the click shows.
  function sentence(text, clamp, title) {
    var el = $("sentence");
    el.textContent = "“" + text + "”";
    if (!clamp) return;
    el.classList.add("clamped");
    el.tabIndex = 0;
    el.title = title;
    var expand = function () { el.classList.toggle("clamped"); };
    el.addEventListener("click", expand);
    el.addEventListener("keydown", function (e) { if (e.key === "Enter") expand(); });
  }
  // #provenance: model, engine, dtype, device, layers × heads, tokens (as the page words them),
  // the kept layers when the page holds fewer than the model's (kept: how many), versions.
  function provenance(data, kept, tokens) {
    var p = data.provenance, v = data.versions;
    var parts = [p.model + " (" + p.architecture + ")", "engine " + p.engine, p.dtype, p.device,
      p.num_layers + " layers × " + p.num_heads + " heads" +
        (p.num_kv_heads !== p.num_heads ? " (" + p.num_kv_heads + " key/value heads)" : ""),
      tokens];
    if (kept < p.num_layers) parts.push("layers kept: " + data.layers.join(", "));
    parts.push(Object.keys(v).map(function (k) { return k + " " + v[k]; }).join(", "));
    $("provenance").textContent = parts.join(" · ");
  }
  function legend(causal) { // the colour bar, and the masked swatch for a causal model
    $("legend-masked").hidden = !causal;
    var lctx = $("legend-bar").getContext("2d");
    for (var i = 0; i < 120; i++) { lctx.fillStyle = css(rgb(i / 119)); lctx.fillRect(i, 0, 1, 12); }
  }

  // --- controls ------------------------------------------------------------------------
  // #head-chips: "all", "none", then one chip per head (click: show or hide it; double-click:
  // this head only), each toggling state.shown and calling render.
  function headChips(heads, state, render) {
    var chips = $("head-chips");
    function chip(label, title, onClick) {
      var b = document.createElement("button");
      b.type = "button"; b.className = "chip"; b.textContent = label; b.title = title;
      b.addEventListener("click", onClick);
      chips.appendChild(b);
      return b;
    }
    chip("all", "show every head", function () { state.shown = state.shown.map(function () { return true; }); render(); });
    chip("none", "hide every head", function () { state.shown = state.shown.map(function () { return false; }); render(); });
    heads.forEach(function (name, h) {
      var b = chip(name, "show or hide " + name + " (double-click: this head only)", function () {
        state.shown[h] = !state.shown[h]; render();
      });
      b.classList.add("head-chip");
      b.setAttribute("data-head", String(h));
      b.style.setProperty("--head", headColour(h));
      b.addEventListener("dblclick", function () {
        state.shown = state.shown.map(function (_, k) { return k === h; }); render();
      });
    });
  }
  function viewTabs(setView) { // the tab buttons call setView with their data-view
    document.querySelectorAll("[data-view]").forEach(function (b) {
      b.addEventListener("click", function () { setView(b.getAttribute("data-view")); });
    });
  }
  function showView(view) { // the one panel shown, its tab selected
    ["head", "model", "matrix"].forEach(function (v) {
      $("view-" + v).hidden = view !== v;
      $("tab-" + v).setAttribute("aria-selected", String(view === v));
    });
  }
  // The controls as the state has them; aggregate: a head-mean-like row is shown, so the head
  // select is off.
  function syncControls(state, aggregate, measures) {
    $("layer").value = String(state.slot);
    $("head").value = String(state.head);
    $("head").disabled = aggregate;
    $("head-field").hidden = state.view !== "matrix";
    $("opt-words").checked = state.words;
    $("opt-special").checked = state.hideSpecial;
    $("opt-mean").checked = state.mean;
    $("opt-norm").checked = state.measure !== measures.first;
    $("legend-label").textContent = measures.legend(state.measure);
  }
  // --- measures ------------------------------------------------------------------------
  // data.measures: the page's measures by name, each {name, label, share_label, sums_to_one}
  // as attnviz.measures.base writes them. The first is the weights; a second, when the page
  // carries one (data.norms), is what the measure toggle shows. The scripts read these
  // properties and never test a measure's name.
  function pageMeasures(data) {
    var weights = { name: "weight", label: "weight", share_label: "weight", sums_to_one: true };
    var byName = data.measures || { weight: weights }; // a page written before measures were objects
    var names = Object.keys(byName);
    var of = function (name) { return byName[name] || byName[names[0]]; };
    return {
      first: names[0],
      second: names.length > 1 ? names[1] : null,
      of: of,
      shares: function (name) { return !of(name).sums_to_one; }, // rows drawn as each row's shares
      legend: function (name) { var m = of(name); return m.sums_to_one ? m.label : m.share_label; },
    };
  }
  function ownKey(ev) { // a key the page's shortcuts may take: not typed into a control, no modifier
    var t = ev.target && ev.target.tagName;
    return !(t === "SELECT" || t === "INPUT" || ev.altKey || ev.ctrlKey || ev.metaKey);
  }

  return {
    $: $, MASKED: MASKED, rgb: rgb, css: css, headColour: headColour,
    FONT: FONT, sized: sized, textWidth: textWidth, heatmap: heatmap,
    showTip: showTip, hideTip: hideTip, fmt: fmt,
    sentence: sentence, provenance: provenance, legend: legend,
    headChips: headChips, viewTabs: viewTabs, showView: showView, syncControls: syncControls, ownKey: ownKey,
    pageMeasures: pageMeasures,
  };
})();

// In a frame (a notebook cell's iframe, the widget's), the page tells its parent how tall it
// is, so the frame can grow to show all of it, footer included: a sandboxed srcdoc page has an
// opaque origin, its parent cannot read its height, and a message is the one way out. Only
// the height goes out ({attnviz: "height", height: px}); the parent's listener
// (attnviz.render.notebook, widget.js) matches the frame by its window. Nothing else is sent.
(function () {
  "use strict";
  if (window.parent === window || typeof window.parent.postMessage !== "function") return;
  var last = -1;
  function report() {
    var body = document.body;
    if (!body) return;
    // The body's bottom edge and margin, not documentElement.scrollHeight (never less than
    // the frame, so it could not shrink), plus a horizontal scroll bar's thickness if any.
    var h = Math.ceil(body.getBoundingClientRect().bottom + window.scrollY
      + (parseFloat(getComputedStyle(body).marginBottom) || 0)
      + (window.innerHeight - document.documentElement.clientHeight));
    if (h === last) return;
    last = h;
    window.parent.postMessage({ attnviz: "height", height: h }, "*");
  }
  if (typeof ResizeObserver === "function") {
    var watch = function () { new ResizeObserver(report).observe(document.body || document.documentElement); };
    if (document.body) watch(); else document.addEventListener("DOMContentLoaded", watch);
  }
  window.addEventListener("load", report);
  document.addEventListener("DOMContentLoaded", report);
})();
