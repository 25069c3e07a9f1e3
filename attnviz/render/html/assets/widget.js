// attnviz live widget: the front end of attnviz.widget() (anywidget ESM). It draws the
// controls and puts the page Python computed (the exported page, attnviz.render.html)
// into a sandboxed iframe; every control writes its traitlet and Python recomputes.
// Requests nothing from any network.

function el(tag, attrs, children) {
  var node = document.createElement(tag);
  Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
  (children || []).forEach(function (c) { node.append(c); });
  return node;
}

function options(select, items, value) {
  select.replaceChildren();
  items.forEach(function (item) {
    var o = el("option", { value: String(item[0]) });
    o.textContent = item[1];
    select.append(o);
  });
  select.value = String(value);
}

function render({ model, el: root }) {
  var text = el("input", { type: "text", class: "attnviz-text", "aria-label": "text", size: "60" });
  var token = el("select", { class: "attnviz-token", "aria-label": "token" });
  var head = el("select", { class: "attnviz-head", "aria-label": "head" });
  var view = el("select", { class: "attnviz-view-select", "aria-label": "view" });
  var boxes = {};
  var bar = el("div", { class: "attnviz-controls", style: "display:flex;flex-wrap:wrap;gap:8px;align-items:center;font:13px system-ui,sans-serif;margin-bottom:4px" }, [
    // No layer control here: the page in the frame has its own (two disagreed); the
    // layer traitlet still sets the layer the page opens on.
    text, el("label", {}, ["token ", token]), el("label", {}, ["head ", head]),
    el("label", {}, ["view ", view]),
  ]);
  [["words", "words"], ["hide_special", "hide special tokens"], ["mean", "head mean"]].forEach(function (pair) {
    var box = el("input", { type: "checkbox", class: "attnviz-" + pair[0] });
    boxes[pair[0]] = box;
    box.addEventListener("change", function () { model.set(pair[0], box.checked); model.save_changes(); });
    bar.append(el("label", {}, [box, " " + pair[1]]));
  });
  var error = el("div", { class: "attnviz-error", role: "alert", style: "color:#a61b0f;font:13px system-ui,sans-serif;margin:2px 0" });
  var frame = el("iframe", { class: "attnviz-view", sandbox: "allow-scripts", title: "attnviz view",
    style: "width:100%;height:640px;border:1px solid #ddd;resize:vertical" });
  root.append(bar, error, frame);
  // The page posts its height (assets/common.js); the frame takes it, so the footer shows.
  window.addEventListener("message", function (e) {
    var d = e.data;
    if (e.source !== frame.contentWindow || !d || d.attnviz !== "height" || typeof d.height !== "number" || !isFinite(d.height)) return;
    frame.style.height = Math.max(120, Math.min(20000, Math.ceil(d.height))) + "px";
  });

  function sync() {
    if (document.activeElement !== text) text.value = model.get("text");
    var labels = model.get("labels");
    options(token, [["", "(none)"]].concat(labels.map(function (l, i) { return [String(i), i + ": " + l]; })), "");
    var t = model.get("token");
    token.value = /^\d+$/.test(t) ? t : "";
    if (t && !/^\d+$/.test(t)) { // a word: pin its first matching piece in the picker
      var i = labels.findIndex(function (l) { return l.toLowerCase() === t.toLowerCase(); });
      if (i >= 0) token.value = String(i);
    }
    var heads = [];
    for (var h = 0; h < model.get("num_heads"); h++) heads.push([h, "h" + h]);
    options(head, heads, model.get("head"));
    options(view, [["head", "head view"], ["model", "model view"], ["matrix", "matrix"]], model.get("view"));
    Object.keys(boxes).forEach(function (k) { boxes[k].checked = model.get(k); });
    error.textContent = model.get("error");
    error.hidden = !model.get("error");
    if (frame.srcdoc !== model.get("page")) frame.srcdoc = model.get("page");
  }

  text.addEventListener("change", function () { model.set("text", text.value); model.save_changes(); });
  token.addEventListener("change", function () { model.set("token", token.value); model.save_changes(); });
  head.addEventListener("change", function () { model.set("head", +head.value); model.save_changes(); });
  view.addEventListener("change", function () { model.set("view", view.value); model.save_changes(); });
  ["text", "token", "layer", "head", "view", "words", "hide_special", "mean", "labels", "layers", "num_heads", "page", "error"]
    .forEach(function (name) { model.on("change:" + name, sync); });
  sync();
}

export default { render };
