// attnviz interactive view, row mode. Self-contained: reads the JSON in #attnviz-data,
// draws on canvases, requests nothing from any network.
//
// The page holds, for every kept layer and head, the rows of a few query tokens only
// (DATA.rows: (N, H, R, S)), and full matrices for the layers in DATA.matrix_slots.
// Shape legend: N kept layers, H heads, R stored query rows, S tokens, U units shown
// (tokens or words, special tokens possibly hidden), B blocks of keys drawn.
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("attnviz-data").textContent);
  var N = DATA.rows.shape[0], H = DATA.rows.shape[1], R = DATA.rows.shape[2], S = DATA.rows.shape[3];
  // Cross-attention (an encoder-decoder's): the queries are the decoder text's tokens
  // (DATA.labels), the keys the source's (DATA.key_labels); words and hidden special
  // tokens are not defined across two texts, so those toggles are off.
  var CROSS = !!DATA.cross;
  var KEY_SPECIAL = CROSS ? DATA.key_special : DATA.special;

  // --- weights ---------------------------------------------------------------------------
  function bytesOf(b64) {
    var bin = atob(b64), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  // Rows: uint8 or uint16 (little-endian), a float32 scale per row: w = q · s.
  function decodeRows(enc) {
    var scales = new Float32Array(bytesOf(enc.scales).buffer), bin = atob(enc.base64);
    var n = scales.length * S, out = new Float32Array(n), i, r, s, at;
    if (enc.dtype === "uint8") {
      for (r = 0, at = 0; r < scales.length; r++) {
        s = scales[r];
        for (i = 0; i < S; i++, at++) out[at] = bin.charCodeAt(at) * s;
      }
    } else {
      for (r = 0, at = 0; r < scales.length; r++) {
        s = scales[r];
        for (i = 0; i < S; i++, at++) out[at] = (bin.charCodeAt(2 * at) | (bin.charCodeAt(2 * at + 1) << 8)) * s;
      }
    }
    return out;
  }
  // Matrices: the full page's encoding, uint16, w = q / scale.
  function decodeMatrix(enc) {
    var bin = atob(enc.base64), n = bin.length >> 1, out = new Float32Array(n);
    for (var i = 0; i < n; i++) out[i] = (bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8)) / enc.scale;
    return out;
  }
  var W = decodeRows(DATA.rows); // (N, H, R, S)
  var MX = DATA.matrices ? decodeMatrix(DATA.matrices) : null; // (M, H, S, S)
  // The norm measure (Kobayashi et al. 2020), when the page carries it: ‖α·f(x)‖ rows,
  // (N, H, R, S), stored like the weights' rows; shown as each row's shares (rule 4).
  var WN = DATA.norms ? decodeRows(DATA.norms) : null;
  var rowIndex = {}; // token position -> r
  DATA.queries.forEach(function (p, r) { rowIndex[p] = r; });
  var matrixOf = {}; // slot -> m
  DATA.matrix_slots.forEach(function (slot, m) { matrixOf[slot] = m; });

  function rawRow(slot, head, token) { // (S,) or null: no row for this token in this layer
    var r = rowIndex[token];
    if (r !== undefined) { var at = ((slot * H + head) * R + r) * S; return (norm() ? WN : W).subarray(at, at + S); }
    if (norm()) return null; // the matrix layers hold weights only (export refuses norms with them)
    var m = matrixOf[slot];
    if (m !== undefined) { var bt = ((m * H + head) * S + token) * S; return MX.subarray(bt, bt + S); }
    return null;
  }

  // --- units: what the rows and columns are after the options --------------------------
  var unitCache = new Map();
  function units(o) {
    var key = (o.words ? 1 : 0) + "" + (o.hideSpecial ? 1 : 0);
    if (unitCache.has(key)) return unitCache.get(key);
    var out = [], i;
    if (o.words) {
      for (i = 0; i < DATA.words.length; i++) {
        var g = DATA.words[i];
        out.push({ label: DATA.word_labels[i], tokens: g, special: g.length === 1 && DATA.special[g[0]] });
      }
    } else {
      for (i = 0; i < DATA.labels.length; i++) out.push({ label: DATA.labels[i], tokens: [i], special: DATA.special[i] });
    }
    if (o.hideSpecial) out = out.filter(function (u) { return !u.special; });
    var of = new Int32Array(DATA.labels.length).fill(-1); // token -> unit (-1: hidden)
    out.forEach(function (u, k) { u.tokens.forEach(function (t) { of[t] = k; }); });
    out.of = of;
    unitCache.set(key, out);
    return out;
  }

  // The key side: the units themselves, or for cross-attention the source's tokens.
  var sourceUnits = null;
  function keyUnits(o) {
    if (!CROSS) return units(o);
    if (sourceUnits === null) {
      sourceUnits = DATA.key_labels.map(function (l, i) { return { label: l, tokens: [i], special: DATA.key_special[i] }; });
      sourceUnits.of = new Int32Array(S).map(function (_, i) { return i; });
    }
    return sourceUnits;
  }

  // One query unit's row over the units, by the rules of attnviz.transforms (the footer
  // says them in words): 1. special tokens set aside, each raw row renormalised (under
  // MIN_LEFT left: shown empty); 2. words: keys summed over a word's pieces, the query's
  // pieces' rows averaged; 3. head mean: the mean of the heads' rows from 1-2.
  var MIN_LEFT = 0.01;
  //   4. the norm measure: each row of 1-3 (raw norms, special tokens set aside but not
  //      renormalised) divided by its sum, its shares (as the full page and transforms.shares).
  var rowCache = new Map();
  function norm() { return MS.shares(state.measure) && WN !== null; }
  function unitRow(slot, head, a, o) { // Float32Array (U) or null: what the views draw
    var raw = rawUnitRow(slot, head, a, o);
    if (raw === null || !norm()) return raw;
    var key = "shares/" + slot + "/" + head + "/" + a + "/" + (o.words ? 1 : 0) + (o.hideSpecial ? 1 : 0);
    if (rowCache.has(key)) return rowCache.get(key);
    var total = 0, k, out = new Float32Array(raw.length);
    for (k = 0; k < raw.length; k++) total += raw[k];
    for (k = 0; k < raw.length; k++) out[k] = total > 0 ? raw[k] / total : 0;
    rowCache.set(key, out);
    return out;
  }
  function rawUnitRow(slot, head, a, o) { // Float32Array (U) or null, by rules 1-3
    var key = state.measure + "/" + slot + "/" + head + "/" + a + "/" + (o.words ? 1 : 0) + (o.hideSpecial ? 1 : 0);
    if (rowCache.has(key)) return rowCache.get(key);
    var us = units(o), ks = keyUnits(o), U = ks.length, out = new Float32Array(U), t, k;
    if (head === "mean") {
      for (var h = 0; h < H; h++) {
        var rh = rawUnitRow(slot, h, a, o);
        if (rh === null) { out = null; break; }
        for (k = 0; k < U; k++) out[k] += rh[k] / H;
      }
    } else {
      var qs = us[a].tokens;
      for (t = 0; t < qs.length && out !== null; t++) {
        var raw = rawRow(slot, head, qs[t]);
        if (raw === null) { out = null; break; }
        var scale = 1;
        if (o.hideSpecial) {
          var total = 0;
          for (k = 0; k < S; k++) if (!KEY_SPECIAL[k]) total += raw[k];
          // Norms are magnitudes: set aside, not renormalised (rule 4 makes the shares).
          scale = norm() ? 1 : total >= MIN_LEFT ? 1 / total : 0;
        }
        for (k = 0; k < S; k++) {
          var u = ks.of[k];
          if (u >= 0) out[u] += raw[k] * scale / qs.length;
        }
      }
    }
    rowCache.set(key, out);
    return out;
  }

  function masked(us, a, b) { // causal: all of key unit b comes after all of query unit a
    if (!DATA.causal || CROSS) return false;
    var qa = us[a].tokens;
    return us[b].tokens[0] > qa[qa.length - 1];
  }

  // The query units: those whose every piece has a stored row.
  function queryUnits(us) {
    var out = [];
    for (var a = 0; a < us.length; a++) {
      var ok = true;
      for (var t = 0; t < us[a].tokens.length; t++) if (rowIndex[us[a].tokens[t]] === undefined) ok = false;
      if (ok) out.push(a);
    }
    return out;
  }

  // --- key blocks: attnviz.render.compact.key_bins, the same rule as the terminal view --
  // Columns 0..columns-1 in at most `cells` contiguous bins [start, end); every column in
  // `own` gets a bin of its own (at most a quarter of the cells), the runs between share
  // the rest in proportion to their length, each cut into near-equal blocks.
  function keyBins(columns, cells, own) {
    var i, out = [];
    if (columns <= 0) return out;
    if (columns <= cells) { for (i = 0; i < columns; i++) out.push([i, i + 1]); return out; }
    var seen = {}, singles = [];
    (own || []).forEach(function (c) { c = Math.floor(c); if (c >= 0 && c < columns && !seen[c]) { seen[c] = 1; singles.push(c); } });
    singles.sort(function (x, y) { return x - y; });
    if (singles.length > Math.floor(cells / 4)) singles = singles.slice(0, Math.floor(cells / 4));
    var runs = [], start = 0;
    singles.forEach(function (s) { if (s > start) runs.push([start, s]); start = s + 1; });
    if (start < columns) runs.push([start, columns]);
    var room = Math.max(cells - singles.length, runs.length), total = 0;
    runs.forEach(function (r) { total += r[1] - r[0]; });
    var share = runs.map(function (r) {
      return total ? Math.max(1, Math.min(r[1] - r[0], Math.floor(room * (r[1] - r[0]) / total))) : 0;
    });
    var spare = room - share.reduce(function (x, y) { return x + y; }, 0);
    var order = runs.map(function (_, k) { return k; });
    order.sort(function (x, y) { return (runs[y][1] - runs[y][0]) - (runs[x][1] - runs[x][0]) || x - y; });
    for (i = 0; i < order.length && spare > 0; i++) {
      var k = order[i], add = Math.min(spare, runs[k][1] - runs[k][0] - share[k]);
      share[k] += add; spare -= add;
    }
    singles.forEach(function (s) { out.push([s, s + 1]); });
    runs.forEach(function (r, k) {
      var a = r[0], b = r[1], n = share[k], prev = a;
      for (var j = 1; j <= n; j++) {
        var edge = roundHalfEven(a + (b - a) * j / n);
        if (edge > prev) { out.push([prev, edge]); prev = edge; }
      }
    });
    out.sort(function (x, y) { return x[0] - y[0]; });
    return out;
  }
  function roundHalfEven(x) { // numpy's round: halves to even
    var f = Math.floor(x), d = x - f;
    if (Math.abs(d - 0.5) < 1e-9) return f % 2 === 0 ? f : f + 1;
    return Math.round(x);
  }
  function ownBins(us, f) { // the query, the first masked unit, special tokens (us: the keys)
    var own = [];
    if (f !== null && !CROSS) {
      own.push(f);
      if (DATA.causal && f + 1 < us.length) own.push(f + 1);
    }
    for (var k = 0; k < us.length; k++) if (us[k].special) own.push(k);
    return own;
  }
  function binned(row, bins) {
    var out = new Float32Array(bins.length);
    for (var b = 0; b < bins.length; b++) {
      var s = 0;
      for (var k = bins[b][0]; k < bins[b][1]; k++) s += row[k];
      out[b] = s;
    }
    return out;
  }
  function binLabel(us, bin) {
    if (bin[1] - bin[0] === 1) return us[bin[0]].label;
    return us[bin[0]].label + " … " + us[bin[1] - 1].label;
  }
  function binWhere(us, bin) {
    var a = us[bin[0]].tokens[0], b = us[bin[1] - 1].tokens;
    b = b[b.length - 1];
    return a === b ? "@" + a : "@" + a + "–" + b;
  }

  // Shared helpers (common.js, inlined before this script): colour, canvas, tooltip, header, chips.
  var C = attnvizCommon, $ = C.$, MASKED = C.MASKED, rgb = C.rgb, headColour = C.headColour;
  var MS = C.pageMeasures(DATA); // the page's measures: their properties, never their names
  var FONT = C.FONT, sized = C.sized, textWidth = C.textWidth, heatmap = C.heatmap;
  var showTip = C.showTip, hideTip = C.hideTip, fmt = C.fmt;
  function headName(h) { return h === "mean" ? "mean" : DATA.heads[h]; }

  // --- state -------------------------------------------------------------------------------
  var state = {
    view: DATA.initial.view,
    slot: DATA.initial.slot,
    head: DATA.initial.head || 0,
    shown: [],
    words: !!DATA.initial.words,
    hideSpecial: !!DATA.initial.hideSpecial,
    mean: !!DATA.initial.mean,
    measure: MS.second !== null && DATA.initial.measure === MS.second && DATA.norms ? MS.second : MS.first,
    pinned: DATA.initial.query, // a token position with a stored row
    hover: null, // unit index under the pointer, head view (a query unit)
  };
  // The heads drawn at first: all, or those the export named (--heads 1,11).
  for (var h0 = 0; h0 < H; h0++) state.shown.push(!DATA.initial.shown || DATA.initial.shown.indexOf(h0) >= 0);
  function opts() { return { words: state.words, hideSpecial: state.hideSpecial }; }
  function unitOf(us, token) {
    if (token === null || token === undefined) return null;
    var u = us.of[token];
    return u >= 0 ? u : null;
  }
  function focusUnit(us) {
    if (state.hover !== null) return state.hover;
    var u = unitOf(us, state.pinned);
    return u !== null && queryUnits(us).indexOf(u) >= 0 ? u : null;
  }
  function layerName(slot) { return "layer " + DATA.layers[slot]; }
  function headsShown() {
    if (state.mean) return ["mean"];
    var out = [];
    for (var h = 0; h < H; h++) if (state.shown[h]) out.push(h);
    return out;
  }


  // --- header, controls ------------------------------------------------------------------------
  function header() {
    var text = DATA.text.trim();
    C.sentence(text.length > 600 ? text.slice(0, 600) + " …" : text, text.length > 160, "click to show more of the text");
    C.provenance(DATA, N, CROSS ? DATA.labels.length + " decoder-text tokens × " + S + " source tokens" : S + " tokens");
    var asked = DATA.queries.map(function (q) { return "“" + DATA.labels[q] + "”@" + q; });
    $("mode-note").textContent = "Row mode: the rows of " + R + " query token" + (R === 1 ? "" : "s") + " (" +
      asked.join(", ") + ") in every layer and head; full matrices: " +
      (DATA.matrix_slots.length ? DATA.matrix_slots.map(function (s) { return "layer " + DATA.layers[s]; }).join(", ") : "none") + ".";
    if (CROSS) {
      $("mode-note").textContent += " Cross-attention: each decoder-text token (left) over the source's " + S +
        " tokens (right): “" + DATA.key_text.trim().slice(0, 200) + "”.";
      ["opt-words", "opt-special"].forEach(function (id) { $(id).parentNode.hidden = true; });
    }
    $("notes").textContent = DATA.notes.join(" · ");
    var bits = DATA.rows.dtype === "uint8" ? 8 : 16;
    $("storage").textContent = "Storage: rows as " + DATA.rows.dtype + " with a scale per row (q = round(w / s), s = the row's largest weight / " +
      (Math.pow(2, bits) - 1) + "); the largest absolute error this introduces in this page is " +
      DATA.rows.max_error.toPrecision(3) + " (computed, exactly, when the page was written)." +
      (DATA.matrices ? " Matrix layers as uint16 (q = round(w × " + DATA.matrices.scale + ")): each weight within 0.000008." : "") +
      (DATA.norms ? " Norms ‖α·f(x)‖ (Kobayashi et al. 2020) as " + DATA.norms.dtype + " the same way, each row over its own largest norm: " +
        "largest error " + DATA.norms.max_error.toPrecision(3) + " in the norms, " + DATA.norms.share_error.toPrecision(3) +
        " in the shares shown (each token's row over its sum)." : "");
    C.legend(DATA.causal);
  }

  function controls() {
    var layer = $("layer"), head = $("head"), i;
    for (i = 0; i < N; i++) {
      layer.add(new Option(String(DATA.layers[i]) + (matrixOf[i] !== undefined ? " (matrix)" : ""), String(i)));
    }
    for (i = 0; i < H; i++) head.add(new Option(DATA.heads[i], String(i)));
    layer.addEventListener("change", function () { state.slot = +layer.value; render(); });
    head.addEventListener("change", function () { state.head = +head.value; render(); });
    $("opt-words").addEventListener("change", function (e) { state.words = e.target.checked; state.hover = null; render(); });
    $("opt-special").addEventListener("change", function (e) { state.hideSpecial = e.target.checked; state.hover = null; render(); });
    $("opt-mean").addEventListener("change", function (e) { state.mean = e.target.checked; render(); });
    $("opt-norm-field").hidden = !WN;
    $("opt-norm").addEventListener("change", function (e) { state.measure = e.target.checked && WN ? MS.second : MS.first; render(); });
    C.viewTabs(setView);
    C.headChips(DATA.heads, state, render);
    document.addEventListener("keydown", keys);
  }

  function setView(view) { state.view = view; state.hover = null; hideTip(); render(); }

  function keys(ev) {
    if (!C.ownKey(ev)) return;
    var k = ev.key;
    if (k === "1" || k === "2" || k === "3") setView(["head", "model", "matrix"][+k - 1]);
    else if (k === "[" || k === "]") { state.slot = Math.max(0, Math.min(N - 1, state.slot + (k === "]" ? 1 : -1))); render(); }
    else if (k === "ArrowLeft" || k === "ArrowUp" || k === "ArrowRight" || k === "ArrowDown") {
      var us = units(opts()), qs = queryUnits(us), at = qs.indexOf(unitOf(us, state.pinned));
      var step = k === "ArrowLeft" || k === "ArrowUp" ? -1 : 1;
      at = at < 0 ? 0 : Math.max(0, Math.min(qs.length - 1, at + step));
      if (qs.length) { state.pinned = us[qs[at]].tokens[0]; state.hover = null; render(); }
    } else return;
    ev.preventDefault();
  }

  // --- head view ---------------------------------------------------------------------------------
  var ROW = 22; // px per token (or block) row
  var MAX_KEYS = 48; // key rows on the right of the lines: more keys are drawn as blocks
  var ALPHA_STEPS = 32;
  var MAX_LINES = 192; // links drawn at most (the strongest)

  function renderHead() {
    var us = units(opts()), qs = queryUnits(us), f = focusUnit(us), heads = headsShown();
    document.querySelectorAll(".head-chip").forEach(function (b) {
      var h = +b.getAttribute("data-head");
      b.setAttribute("aria-pressed", String(state.shown[h]));
      b.disabled = state.mean;
    });
    $("head-help").textContent = (state.mean
      ? "Head mean: one dark line per link, its opacity the mean weight of the layer's " + H + " heads."
      : "Click a query token on the left to pin it (one colour per head, opacity = weight). " + heads.length + " of " + H + " heads shown.") +
      (us.length > MAX_KEYS ? " The " + us.length + " keys are drawn in blocks: a block's weight is the sum over its keys." : "");
    var left = $("hv-left");
    left.textContent = "";
    qs.forEach(function (u) {
      var b = document.createElement("button");
      b.type = "button";
      b.className = "tok" + (us[u].special ? " special" : "") + (u === f ? " focus" : "") + (unitOf(us, state.pinned) === u ? " pinned" : "");
      b.textContent = us[u].label + " @" + us[u].tokens[0];
      b.setAttribute("data-unit", String(u));
      b.setAttribute("role", "option");
      b.setAttribute("aria-selected", String(unitOf(us, state.pinned) === u));
      b.addEventListener("mouseenter", function () { if (state.hover !== u) { state.hover = u; drawSoon(); } });
      b.addEventListener("mouseleave", function () { state.hover = null; drawSoon(); });
      b.addEventListener("click", function () {
        state.pinned = unitOf(us, state.pinned) === u ? null : us[u].tokens[0];
        state.hover = null;
        render();
      });
      left.appendChild(b);
    });
    drawHead();
  }

  var drawPending = false;
  function drawSoon() {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(function () { drawPending = false; if (state.view === "head") drawHead(); });
  }

  function drawHead() {
    var o = opts(), us = units(o), ks = keyUnits(o), U = ks.length, qs = queryUnits(us), f = focusUnit(us), heads = headsShown();
    var bins = keyBins(U, MAX_KEYS, ownBins(ks, f)), B = bins.length;
    var right = $("hv-right");
    right.textContent = "";
    var shades = new Float32Array(B);
    var rowsOf = heads.map(function (h) { return f === null ? null : unitRow(state.slot, h, f, o); });
    rowsOf.forEach(function (row) {
      if (row === null) return;
      var bs = binned(row, bins);
      for (var b = 0; b < B; b++) shades[b] += bs[b] / heads.length;
    });
    bins.forEach(function (bin, b) {
      var r = document.createElement("span");
      var single = bin[1] - bin[0] === 1;
      r.className = "tok" + (single && ks[bin[0]].special ? " special" : "") + (single ? "" : " bin");
      r.textContent = single ? ks[bin[0]].label : binLabel(ks, bin) + " " + binWhere(ks, bin);
      r.setAttribute("data-bin", String(b));
      if (shades[b] > 0) r.style.background = "rgba(255, 160, 0, " + Math.min(1, shades[b]).toFixed(3) + ")";
      r.title = f === null ? binWhere(ks, bin) : us[f].label + " → " + binLabel(ks, bin) + " " + binWhere(ks, bin) + ": " +
        fmt(shades[b]) + (heads.length > 1 ? " (mean of the heads drawn)" : "") + (single ? "" : ", summed over the block");
      right.appendChild(r);
    });
    var canvas = $("hv-canvas"), width = 220, height = Math.max(qs.length, B) * ROW, ctx = sized(canvas, width, height);
    canvas.setAttribute("data-focus", f === null ? "" : us[f].label);
    canvas.setAttribute("data-bins", String(B));
    ctx.clearRect(0, 0, width, height);
    // The MAX_LINES strongest links (at least 1% each): 32 heads × 48 blocks of a long row
    // are 1,536 curves, which a software canvas took ~200 ms to rasterise (busy 2-core
    // machine); the strongest few hundred carry the picture.
    var n = Math.max(heads.length, 1), paths = heads.map(function () { return []; }), links = [];
    var sources = f === null ? qs : [f];
    sources.forEach(function (a) {
      heads.forEach(function (h, hi) {
        var row = f === null ? unitRow(state.slot, h, a, o) : rowsOf[hi];
        if (row === null) return;
        var bs = f === null ? binned(row, keyBins(U, MAX_KEYS, ownBins(ks, a))) : binned(row, bins);
        for (var b = 0; b < bs.length; b++) if (bs[b] >= 0.01) links.push([hi, qs.indexOf(a), b, Math.min(1, bs[b])]);
      });
    });
    if (links.length > MAX_LINES) {
      links.sort(function (p, q) { return q[3] - p[3]; });
      links.length = MAX_LINES;
    }
    links.forEach(function (L) {
      var step = Math.max(1, Math.round(L[3] * (f === null ? 0.35 : 1) * ALPHA_STEPS));
      var x0 = 4 + L[0] * 3 * Math.min(1, 6 / n), ya = L[1] * ROW + ROW / 2, yb = L[2] * ROW + ROW / 2;
      var path = paths[L[0]][step] || (paths[L[0]][step] = new Path2D());
      path.moveTo(x0, ya);
      path.bezierCurveTo(width * 0.45, ya, width * 0.55, yb, width - 4, yb);
    });
    canvas.setAttribute("data-links", String(links.length));
    ctx.lineWidth = f === null ? 1 : 2;
    paths.forEach(function (bySteps, hi) {
      ctx.strokeStyle = headColour(heads[hi]);
      for (var st = 1; st < bySteps.length; st++) {
        if (!bySteps[st]) continue;
        ctx.globalAlpha = st / ALPHA_STEPS;
        ctx.stroke(bySteps[st]);
      }
    });
    ctx.globalAlpha = 1;
    document.querySelectorAll("#hv-left .tok").forEach(function (b) { b.classList.toggle("focus", +b.getAttribute("data-unit") === f); });
    drawDetail(us, ks, f);
  }

  var RH = 16; // px per head row in the detail
  function drawDetail(us, ks, f) {
    var canvas = $("detail-canvas"), U = ks.length, o = opts();
    var rows = [];
    for (var h = 0; h < H; h++) rows.push(h);
    if (state.mean) rows.push("mean");
    if (f === null) {
      $("detail-title").textContent = "Click a query token to see its attention in each head of " + layerName(state.slot) + ".";
      sized(canvas, 1, 1);
      canvas.setAttribute("data-focus", "");
      $("detail-axis").textContent = ""; $("detail-best").textContent = ""; $("links").textContent = "";
      return;
    }
    $("detail-title").textContent = "“" + us[f].label + "” (@" + us[f].tokens[0] + ") → each " + (CROSS ? "source token" : state.words ? "word" : "token") +
      ", " + layerName(state.slot) + ", per head" + (state.hideSpecial ? " (special tokens hidden, rows renormalised)" : "");
    canvas.setAttribute("data-focus", us[f].label);
    var ctx0 = canvas.getContext("2d");
    ctx0.font = FONT;
    var left = Math.ceil(textWidth(ctx0, rows.map(headName))) + 10;
    var avail = Math.max(300, ($("detail").clientWidth || 720) - left - 8);
    var perUnit = U * 12 <= avail; // room for a labelled cell per unit
    var bins = perUnit ? keyBins(U, U, []) : keyBins(U, Math.floor(avail / 2), ownBins(ks, f)), B = bins.length;
    var cell = perUnit ? Math.max(12, Math.min(34, Math.floor(avail / U))) : avail / B;
    var bottom = perUnit ? Math.ceil(textWidth(ctx0, ks.map(function (u) { return u.label; }))) + 10 : 10;
    var ctx = sized(canvas, left + B * cell + 8, rows.length * RH + bottom + 4);
    ctx.font = FONT;
    var full = rows.map(function (h) { return unitRow(state.slot, h, f, o); });
    var values = new Float32Array(rows.length * B);
    full.forEach(function (row, r) { var bs = binned(row, bins); for (var c = 0; c < B; c++) values[r * B + c] = bs[c]; });
    var maskBin = function (r, c) { return masked(us, f, bins[c][0]); };
    heatmap(ctx, values, rows.length, B, left, 0, cell, RH, maskBin);
    ctx.textBaseline = "middle"; ctx.textAlign = "right";
    rows.forEach(function (h, r) { ctx.fillStyle = h === "mean" ? "#000" : headColour(h); ctx.fillText(headName(h), left - 6, r * RH + RH / 2); });
    var qb = -1;
    for (var b = 0; b < B && !CROSS; b++) if (bins[b][0] <= f && f < bins[b][1]) qb = b;
    if (perUnit) {
      ctx.save();
      for (var c = 0; c < B; c++) {
        ctx.save();
        ctx.translate(left + c * cell + cell / 2, rows.length * RH + 4);
        ctx.rotate(-Math.PI / 2);
        ctx.fillStyle = c === qb ? "#c00000" : ks[c].special ? "#888" : "#222";
        ctx.font = (c === qb ? "bold " : "") + FONT;
        ctx.fillText(ks[c].label, 0, 0);
        ctx.restore();
      }
      ctx.restore();
      $("detail-axis").textContent = "";
    } else {
      ctx.fillStyle = "#c00000"; // the query's own block, marked under the strip
      if (qb >= 0) ctx.fillRect(left + qb * cell, rows.length * RH + 2, Math.max(2, cell), 6);
      $("detail-axis").textContent = U + " " + (CROSS ? "source tokens" : state.words ? "words" : "tokens") + " in " + B + " blocks (each cell the summed weight of its keys; " +
        "the query, the first masked token and special tokens in blocks of their own; red: the query).";
    }
    canvas.setAttribute("data-blocks", String(B));
    canvas.onmousemove = function (ev) {
      var bx = canvas.getBoundingClientRect(), x = ev.clientX - bx.left - left, y = ev.clientY - bx.top;
      var c = Math.floor(x / cell), r = Math.floor(y / RH);
      if (c < 0 || c >= B || r < 0 || r >= rows.length) return hideTip();
      var bin = bins[c];
      showTip(ev, headName(rows[r]) + ": “" + us[f].label + "” → “" + binLabel(ks, bin) + "” " + binWhere(ks, bin) + " " +
        (maskBin(r, c) ? "masked" : fmt(values[r * B + c]) + (bin[1] - bin[0] > 1 ? " (sum of " + (bin[1] - bin[0]) + ")" : "")));
    };
    canvas.onmouseleave = hideTip;
    strongest(us, ks, f, rows, full);
  }

  // The strongest links of the focused query to other keys that are not special tokens,
  // over the rows drawn, unbinned: the finding, in words, and a list of the first few.
  var LINKS = 8;
  function strongest(us, ks, f, rows, full) {
    var top = [];
    full.forEach(function (row, r) {
      for (var c = 0; c < ks.length; c++) {
        if ((c === f && !CROSS) || ks[c].special || masked(us, f, c)) continue;
        var w = row[c];
        if (top.length < LINKS || w > top[top.length - 1][2]) {
          top.push([rows[r], c, w]);
          top.sort(function (p, q) { return q[2] - p[2]; });
          if (top.length > LINKS) top.length = LINKS;
        }
      }
    });
    var word = CROSS ? "source token" : state.words ? "word" : "token";
    $("detail-best").textContent = top.length ? "Strongest link to " + (CROSS ? "a " : "another ") + word + " (special tokens aside): " +
      headName(top[0][0]) + " → “" + ks[top[0][1]].label + "” @" + ks[top[0][1]].tokens[0] + " " + fmt(top[0][2]) + "." : "";
    var list = $("links");
    list.textContent = "";
    top.forEach(function (t) {
      var li = document.createElement("li");
      li.textContent = headName(t[0]) + " → “" + ks[t[1]].label + "” ";
      var pos = document.createElement("span");
      pos.className = "pos";
      pos.textContent = "@" + ks[t[1]].tokens[0] + " ";
      li.appendChild(pos);
      li.appendChild(document.createTextNode(fmt(t[2])));
      list.appendChild(li);
    });
  }

  // --- model view: every layer × head, the query's row as a strip -----------------------------
  function renderModel() {
    var o = opts(), us = units(o), ks = keyUnits(o), U = ks.length, qs = queryUnits(us), f = unitOf(us, state.pinned);
    if (f === null || qs.indexOf(f) < 0) f = qs.length ? qs[0] : null;
    var canvas = $("model-canvas");
    if (f === null) { $("model-help").textContent = "No query token to draw."; sized(canvas, 1, 1); return; }
    var heads = [];
    for (var h = 0; h < H; h++) heads.push(h);
    if (state.mean) heads.push("mean");
    var ctx0 = canvas.getContext("2d");
    ctx0.font = FONT;
    var left = Math.ceil(textWidth(ctx0, DATA.layers.map(function (l) { return "L" + l; }))) + 10, top = 18;
    var avail = Math.max(400, ($("view-model").clientWidth || 1200) - left - 8);
    var gap = 2, cw = Math.max(16, Math.min(160, Math.floor(avail / heads.length) - gap)), sh = 12;
    var bins = keyBins(U, cw, ownBins(ks, f)), B = bins.length;
    $("model-help").textContent = "“" + us[f].label + "” (@" + us[f].tokens[0] + "): each strip is its row in one layer (rows) and head (columns), " +
      U + " keys in " + B + " blocks (summed weight). Click a strip to open that layer and head in the head view.";
    var width = heads.length * (cw + gap), height = N * (sh + gap);
    var img = document.createElement("canvas");
    img.width = width; img.height = height;
    var ictx = img.getContext("2d"), data = ictx.createImageData(width, height), px = data.data;
    for (var slot = 0; slot < N; slot++) {
      heads.forEach(function (hh, hi) {
        var row = unitRow(slot, hh, f, o);
        if (row === null) return;
        var bs = binned(row, bins);
        for (var b = 0; b < B; b++) {
          var col = masked(us, f, bins[b][0]) ? MASKED : rgb(bs[b]), x = hi * (cw + gap) + b;
          for (var y = 0; y < sh; y++) {
            var p = 4 * ((slot * (sh + gap) + y) * width + x);
            px[p] = col[0]; px[p + 1] = col[1]; px[p + 2] = col[2]; px[p + 3] = 255;
          }
        }
      });
    }
    ictx.putImageData(data, 0, 0);
    var ctx = sized(canvas, left + width + 8, top + height + 4);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(img, left, top);
    ctx.font = FONT; ctx.textBaseline = "middle"; ctx.textAlign = "right";
    for (slot = 0; slot < N; slot++) {
      ctx.fillStyle = slot === state.slot ? "#000" : "#5f6368";
      ctx.fillText("L" + DATA.layers[slot], left - 6, top + slot * (sh + gap) + sh / 2);
    }
    ctx.textAlign = "center";
    var every = Math.max(1, Math.ceil(28 / (cw + gap)));
    heads.forEach(function (hh, hi) {
      if (hi % every && hh !== "mean") return;
      ctx.fillStyle = headColour(hh);
      ctx.fillText(hh === "mean" ? "mean" : String(hh), left + hi * (cw + gap) + cw / 2, top / 2);
    });
    canvas.setAttribute("data-blocks", String(B));
    canvas.setAttribute("data-left", String(left)); canvas.setAttribute("data-top", String(top));
    canvas.setAttribute("data-cw", String(cw + gap)); canvas.setAttribute("data-sh", String(sh + gap));
    function at(ev) {
      var bx = canvas.getBoundingClientRect(), x = ev.clientX - bx.left - left, y = ev.clientY - bx.top - top;
      var hi = Math.floor(x / (cw + gap)), sl = Math.floor(y / (sh + gap));
      return hi < 0 || hi >= heads.length || sl < 0 || sl >= N ? null : [sl, heads[hi], Math.floor(x - hi * (cw + gap))];
    }
    canvas.onmousemove = function (ev) {
      var p = at(ev);
      if (p === null) return hideTip();
      var row = unitRow(p[0], p[1], f, o), best = -1;
      for (var c = 0; c < U; c++) if ((c !== f || CROSS) && !ks[c].special && !masked(us, f, c) && (best < 0 || row[c] > row[best])) best = c;
      var b = Math.min(B - 1, Math.max(0, p[2]));
      showTip(ev, layerName(p[0]) + ", " + headName(p[1]) + ": block “" + binLabel(ks, bins[b]) + "” " + binWhere(ks, bins[b]) + " " +
        fmt(binned(row, [bins[b]])[0]) + (best >= 0 ? " · strongest: “" + ks[best].label + "” @" + ks[best].tokens[0] + " " + fmt(row[best]) : ""));
    };
    canvas.onmouseleave = hideTip;
    canvas.onclick = function (ev) {
      var p = at(ev);
      if (p === null) return;
      state.slot = p[0];
      if (p[1] === "mean") state.mean = true;
      else { state.mean = false; state.shown = state.shown.map(function (_, k) { return k === p[1]; }); state.head = p[1]; }
      state.pinned = us[f].tokens[0];
      setView("head");
    };
  }

  // --- matrix view: only the layers that hold full matrices -----------------------------------
  function renderMatrix() {
    var canvas = $("matrix-canvas"), o = opts(), us = units(o), U = us.length, h = state.mean ? "mean" : state.head;
    if (matrixOf[state.slot] === undefined) {
      $("matrix-title").textContent = layerName(state.slot) + " has no full matrix in this page (it holds only the query tokens' rows). " +
        (DATA.matrix_slots.length ? "Layers with one: " + DATA.matrix_slots.map(function (s) { return DATA.layers[s]; }).join(", ") + "."
          : "Write the page with --matrix-layer N to add one.");
      sized(canvas, 1, 1);
      return;
    }
    var f = unitOf(us, state.pinned), M = new Float32Array(U * U);
    for (var a = 0; a < U; a++) M.set(unitRow(state.slot, h, a, o), a * U);
    $("matrix-title").textContent = layerName(state.slot) + ", " + (h === "mean" ? "mean of the " + H + " heads" : headName(h)) +
      ": each row is a query " + (state.words ? "word" : "token") + ", each column a key." + (DATA.causal ? " Grey: masked." : "");
    var ctx0 = canvas.getContext("2d");
    ctx0.font = FONT;
    var lw = Math.ceil(textWidth(ctx0, us.map(function (u) { return u.label; }))) + 10;
    var avail = Math.max(320, ($("view-matrix").clientWidth || 960) - lw - 16);
    var cell = Math.min(30, avail / U), top = 8;
    var ctx = sized(canvas, lw + U * cell + 8, top + U * cell + 8);
    ctx.font = FONT;
    ctx.translate(0, top);
    heatmap(ctx, M, U, U, lw, 0, cell, cell, function (r, k) { return masked(us, r, k); });
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    var every = Math.max(1, Math.ceil(14 / cell));
    for (var r = 0; r < U; r++) {
      if (r % every && r !== f) continue;
      ctx.fillStyle = r === f ? "#c00000" : us[r].special ? "#888" : "#222";
      ctx.fillText(us[r].label, lw - 6, r * cell + cell / 2);
    }
    canvas.onmousemove = function (ev) {
      var bx = canvas.getBoundingClientRect();
      var rr = Math.floor((ev.clientY - bx.top - top) / cell), k = Math.floor((ev.clientX - bx.left - lw) / cell);
      if (rr < 0 || rr >= U || k < 0 || k >= U) return hideTip();
      showTip(ev, "“" + us[rr].label + "” → “" + us[k].label + "”: " + (masked(us, rr, k) ? "masked" : fmt(M[rr * U + k])));
    };
    canvas.onmouseleave = hideTip;
  }

  // --- render --------------------------------------------------------------------------------
  function render() {
    C.showView(state.view);
    $("tab-matrix").classList.toggle("tab-off", matrixOf[state.slot] === undefined);
    C.syncControls(state, state.mean, MS); // state.measure is the second only when the page has norms
    if (state.view === "head") renderHead();
    else if (state.view === "model") renderModel();
    else renderMatrix();
  }

  header();
  controls();
  render();

  // For tests and the curious (browser console).
  window.attnviz = {
    data: DATA,
    state: state,
    render: render,
    units: function (o) { return units(o || opts()).map(function (u) { return u.label; }); },
    // One query token's row over the units (after the options), or null without a row.
    row: function (slot, head, token, o) {
      var us = units(o || opts()), u = us.of[token], r = u >= 0 ? unitRow(slot, head, u, o || opts()) : null;
      return r === null ? null : Array.prototype.slice.call(r);
    },
    raw: function (slot, head, token) { var r = rawRow(slot, head, token); return r === null ? null : Array.prototype.slice.call(r); },
    bins: keyBins,
  };
})();
