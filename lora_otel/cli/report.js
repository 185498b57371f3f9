(function () {
"use strict";
var DATA = JSON.parse(document.getElementById("lora-otel-data").textContent);
var FLAG = ["ok", "error", "open", "stalled", "killed"];
var MARK = ["", "\u2715 ERROR ", "\u2026 OPEN ", "\u26a0 STALLED ", "\u2020 KILLED "];
function esc(s) {
  return String(s).replace(/[&<>"']/g, function (c) {
    return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c];
  });
}
function dur(ms) {
  var s = Math.max(ms, 0) / 1000;
  if (s >= 100) return s.toFixed(0) + " s";
  if (s >= 1) return s.toPrecision(3).replace(/\.?0+$/, "") + " s";
  var m = s * 1000;
  if (m >= 1) return (m >= 100 ? m.toFixed(0) : m.toPrecision(3).replace(/\.?0+$/, "")) + " ms";
  return m.toPrecision(2) + " ms";
}
function tickStep(total) {
  var raw = total / 8, p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
  var steps = [1, 2, 5, 10];
  for (var i = 0; i < steps.length; i++) if (steps[i] * p >= raw) return steps[i] * p;
  return 10 * p;
}
function kv(obj) {
  var keys = Object.keys(obj || {}).sort();
  if (!keys.length) return "";
  var out = '<table class="kv">';
  keys.forEach(function (k) {
    var v = obj[k];
    out += "<tr><th>" + esc(k) + "</th><td>" + esc(typeof v === "string" ? v : JSON.stringify(v)) + "</td></tr>";
  });
  return out + "</table>";
}
DATA.jobs.forEach(function (job, ji) {
  var root = document.getElementById("job-" + ji);
  var body = root.querySelector(".wf-body"), space = root.querySelector(".wf-space");
  var axis = root.querySelector(".wf-axis"), panel = root.querySelector(".details");
  var total = job.end * 1.02, folded = {}, rows = [], tops = [], selected = null, pending = false;
  function pct(ms) { return (Math.max(ms, 0) / total * 100).toFixed(3) + "%"; }
  function build() {
    rows = []; tops = []; var y = 0;
    job.lanes.forEach(function (lane, li) {
      rows.push({k: "lane", li: li}); tops.push(y); y += 24;
      if (folded[li]) return;
      lane.spans.forEach(function (s, si) {
        rows.push({k: "span", li: li, si: si}); tops.push(y); y += 20;
        if (si === lane.diag_at) { rows.push({k: "diag", li: li, si: si}); tops.push(y); y += 40; }
      });
    });
    tops.push(y);
    space.style.height = y + "px";
    draw();
  }
  function first(top) {
    var lo = 0, hi = rows.length - 1;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (tops[mid] <= top) lo = mid; else hi = mid - 1; }
    return lo;
  }
  function rowHtml(r, i) {
    var lane = job.lanes[r.li], style = ' style="top:' + tops[i] + 'px"';
    if (r.k === "lane") {
      return '<div class="row lane" data-i="' + i + '"' + style + ' role="button" title="fold or unfold this lane">' +
        '<div class="n">' + (folded[r.li] ? "\u25b8 " : "\u25be ") + esc(lane.label) + " \u00b7 pid " + esc(lane.pid) +
        " \u00b7 " + esc(lane.name) + '</div><div class="t"><div class="life" style="left:' + pct(lane.start) +
        ";width:" + pct(lane.end - lane.start) + '"></div>' + (job.now !== null ? '<div class="now" style="left:' +
        pct(job.now) + '"></div>' : "") + '</div><div class="d">' + esc(lane.outcome.toUpperCase()) + "</div></div>";
    }
    var s = lane.spans[r.si];
    if (r.k === "diag") {
      return '<div class="row diag" data-i="' + i + '"' + style + ' title="' + esc(lane.diagnosis) + '">' +
        esc(lane.diagnosis) + "</div>";
    }
    var sel = selected && selected.li === r.li && selected.si === r.si ? " sel" : "";
    return '<div class="row f' + s[4] + sel + '" data-i="' + i + '"' + style + ' role="button">' +
      '<div class="n" style="padding-left:' + (4 + 12 * s[1]) + 'px" title="' + esc(s[0]) + '">' + esc(s[0]) + "</div>" +
      '<div class="t"><div class="bar b' + s[4] + '" style="left:' + pct(s[2]) + ";width:" + pct(s[3] - s[2]) +
      '" title="' + esc(s[0]) + " \u2014 " + FLAG[s[4]] + '"></div></div><div class="d">' + MARK[s[4]] +
      dur(s[3] - s[2]) + "</div></div>";
  }
  function draw() {
    var top = body.scrollTop, h = body.clientHeight || 600;
    var a = Math.max(first(top) - 8, 0), b = Math.min(first(top + h) + 9, rows.length), out = "";
    for (var i = a; i < b; i++) out += rowHtml(rows[i], i);
    space.innerHTML = out;
  }
  function drawAxis() {
    var step = tickStep(total), out = "";
    for (var t = 0; t <= total; t += step) out += '<span style="left:' + pct(t) + '">' + (t ? "+" + dur(t) : "0") + "</span>";
    axis.innerHTML = out;
  }
  function show(li, si) {
    selected = {li: li, si: si};
    var lane = job.lanes[li], s = lane.spans[si], d = lane.details[si], out = "";
    out += "<h3>" + esc(s[0]) + "</h3><p><b>" + (MARK[s[4]] || "ok ").trim() + "</b> \u00b7 " +
      esc(lane.who) + "</p><table class=\"kv\"><tr><th>start</th><td>+" + dur(s[2]) + " (" + esc(d.start) + ")</td></tr>" +
      (d.end ? "<tr><th>duration</th><td>" + esc(d.dur) + "</td></tr>" : "<tr><th>open for</th><td>" + esc(d.open) +
      (lane.outcome === "running" || lane.outcome === "stalled" ? " (still open)" : " (until the process's last sign of life)") + "</td></tr>") +
      "<tr><th>status</th><td>" + esc(d.status) + "</td></tr><tr><th>span id</th><td>" + esc(d.id) + "</td></tr>" +
      "<tr><th>journal</th><td>" + esc(lane.journal) + "</td></tr></table>";
    if (d.message) out += "<h4>Message</h4><pre>" + esc(d.message) + "</pre>";
    var stall = lane.stall && (si === lane.diag_at || s[1] === 0);
    if (stall) out += '<h4>Stall</h4><div class="stall">' + esc(lane.diagnosis) + "</div>" +
      (lane.advice ? '<p class="advice">' + esc(lane.advice) + "</p>" : "");
    if (d.stacks) {
      if (lane.main) out += "<h4>Main thread</h4><p>" + esc(lane.main) + "</p>";
      out += "<h4>Stacks</h4>" + (lane.stacks.length ? '<pre class="stacks">' + esc(lane.stacks.join("\n")) + "</pre>" :
        '<p class="hint">No stack dump in this process\'s stacks file (one is taken when a stall is declared).</p>');
    }
    if (stall && Object.keys(lane.stall.evidence || {}).length)
      out += "<details><summary>Evidence (" + Object.keys(lane.stall.evidence).length + ")</summary>" + kv(lane.stall.evidence) + "</details>";
    var attrs = d.attrs || {};
    out += "<h4>Attributes (" + Object.keys(attrs).length + ")</h4>" + (kv(attrs) || '<p class="hint">none</p>');
    var events = d.events || [];
    out += "<h4>Events (" + events.length + ")</h4>";
    events.forEach(function (e) { out += "<p>+" + dur(e[0]) + " <b>" + esc(e[1]) + "</b></p>" + kv(e[2]); });
    panel.innerHTML = out;
    draw();
  }
  space.addEventListener("click", function (ev) {
    var el = ev.target.closest(".row");
    if (!el) return;
    var r = rows[+el.getAttribute("data-i")];
    if (r.k === "lane") { folded[r.li] = !folded[r.li]; build(); }
    else if (r.k === "span") show(r.li, r.si);
  });
  body.addEventListener("keydown", function (ev) {
    if (ev.key !== "Enter" || !selected) return;
    show(selected.li, selected.si);
  });
  body.addEventListener("scroll", function () {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; draw(); });
  }, {passive: true});
  window.addEventListener("resize", draw);
  build(); drawAxis();
  // open on the span to look at: the stalled one of the process called out, else its deepest open one
  var start = null;
  job.lanes.forEach(function (lane, li) {
    lane.spans.forEach(function (s, si) {
      var score = (s[4] === 3 ? 4 : s[4] === 4 ? 2 : s[4] === 1 ? 1 : 0) + (lane.focus ? 8 : 0);
      if (score && (!start || score > start.score || (score === start.score && s[1] >= start.depth)))
        start = {li: li, si: si, score: score, depth: s[1]};
    });
  });
  if (start) {
    show(start.li, start.si);
    for (var i = 0; i < rows.length; i++) if (rows[i].k === "span" && rows[i].li === start.li && rows[i].si === start.si) {
      body.scrollTop = Math.max(tops[i] - 80, 0); draw(); break;
    }
  }
});
})();
