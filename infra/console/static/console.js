// agentstream console: the overview refreshes itself; filter forms leave empty fields out of the URL.
(function () {
  "use strict";

  function fmt(value, digits) {
    if (value === null || value === undefined || (typeof value === "number" && isNaN(value))) return "—";
    if (typeof value === "number") {
      if (Number.isInteger(value)) return value.toLocaleString("en-US");
      return Math.abs(value) < 1000 ? value.toFixed(digits === undefined ? 3 : digits) : Math.round(value).toLocaleString("en-US");
    }
    return String(value);
  }

  function utc(seconds) {
    return new Date(seconds * 1000).toISOString().slice(11, 19) + " UTC";
  }

  function cell(text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }

  function fillRows(tbody, rows, build, empty) {
    tbody.replaceChildren();
    if (!rows.length) {
      var tr = document.createElement("tr");
      tr.className = "none";
      var td = cell(empty);
      td.colSpan = 5;
      tr.appendChild(td);
      tbody.appendChild(tr);
    }
    rows.forEach(function (row) { tbody.appendChild(build(row)); });
  }

  function topicRow(t) {
    var tr = document.createElement("tr");
    tr.dataset.topic = t.topic;
    tr.append(cell(t.topic), cell(fmt(t.records), "n"), cell(fmt(t.rate, 1), "n"));
    tr.children[1].dataset.field = "records";
    tr.children[2].dataset.field = "rate";
    return tr;
  }

  function groupRow(g) {
    var tr = document.createElement("tr");
    tr.dataset.group = g.group;
    tr.append(cell(g.group), cell(g.topics), cell(fmt(g.rate, 1), "n"), cell(fmt(g.lag), "n"));
    tr.children[2].dataset.field = "rate";
    tr.children[3].dataset.field = "lag";
    return tr;
  }

  function letterRow(d) {
    var tr = document.createElement("tr");
    var source = (d.source_topic || "—") + "[" + fmt(d.source_partition) + "]@" + fmt(d.source_offset);
    tr.append(cell(String(d.occurred_at).slice(0, 19)), cell(d.stage), cell(d.reason, "reason"), cell(source, "mono"));
    var link = cell("", "mono");
    if (d.trajectory_id) {
      var a = document.createElement("a");
      a.href = "/trajectories/" + encodeURIComponent(d.trajectory_id);
      a.textContent = d.trajectory_id;
      link.appendChild(a);
    } else link.textContent = "—";
    tr.appendChild(link);
    return tr;
  }

  function render(data) {
    Object.keys(data.counts || {}).forEach(function (key) {
      var el = document.querySelector('[data-field="counts.' + key + '"]');
      if (el) el.textContent = fmt(data.counts[key]);
    });
    var kafka = data.kafka || {};
    var problem = document.getElementById("kafka-error");
    if (problem) { problem.textContent = kafka.error || ""; problem.hidden = !kafka.error; }
    var dlq = document.querySelector('[data-field="kafka.dlq"]');
    if (dlq) dlq.textContent = fmt(kafka.dlq);
    if (kafka.topics) fillRows(document.querySelector("#topics tbody"), kafka.topics, topicRow, "no topics");
    if (kafka.groups) fillRows(document.querySelector("#groups tbody"), kafka.groups, groupRow, "no consumer groups");
    fillRows(document.querySelector("#dead-letters tbody"), data.dead_letters || [], letterRow, "no dead letters");
    var updated = document.getElementById("updated");
    if (updated) updated.textContent = utc(data.at);
  }

  function poll(root) {
    var every = parseFloat(root.dataset.refreshS || "2") * 1000;
    var live = document.querySelector(".live");
    function tick() {
      fetch("/api/overview", { headers: { Accept: "application/json" }, credentials: "same-origin" })
        .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
        .then(function (data) { render(data); if (live) live.classList.remove("stale"); })
        .catch(function () { if (live) live.classList.add("stale"); })
        .finally(function () { setTimeout(tick, every); });
    }
    setTimeout(tick, every);
  }

  function cleanForms() {
    document.querySelectorAll("form.filters").forEach(function (form) {
      form.addEventListener("submit", function () {
        form.querySelectorAll("input, select").forEach(function (el) { if (!el.value) el.disabled = true; });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("overview");
    if (root) poll(root);
    var updated = document.getElementById("updated");
    if (updated && /^\d+$/.test(updated.textContent)) updated.textContent = utc(parseInt(updated.textContent, 10));
    cleanForms();
  });
})();
