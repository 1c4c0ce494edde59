// cloud-web dashboard: makes pages live. Without it every page still works.
// Everything arriving from the server is either HTML the server rendered
// and escaped (the node table) or text put in with textContent (log lines,
// a deployment's state).
"use strict";
(function () {
  // The node table: the server sends the rendered rows when they change.
  var rows = document.getElementById("node-rows");
  if (rows && window.EventSource) {
    var lang = document.documentElement.lang || "en";
    var live = rows.getAttribute("data-live");
    var source = new EventSource(live + (live.indexOf("?") < 0 ? "?" : "&") + "lang=" + encodeURIComponent(lang));
    source.addEventListener("rows", function (event) {
      rows.innerHTML = event.data;
      var empty = document.getElementById("nodes-empty");
      if (empty && rows.children.length > 0) { empty.remove(); }
    });
  }

  // A deployment's state badge, as the server renders it.
  function badge(state, label) {
    var span = document.createElement("span");
    span.className = "badge " + state;
    span.setAttribute("data-state", state);
    span.textContent = label;
    return span;
  }
  function setText(id, text) {
    var element = document.getElementById(id);
    if (element) { element.textContent = text; }
  }

  // A deployment's page: the stream's `state` events carry what the page
  // shows besides the log (state, commit, image, instances, timeline);
  // every value goes in as text.
  function showDeployment(live) {
    var state = document.getElementById("deployment-state");
    if (state) { state.replaceChildren(badge(live.state, live.state_label)); }
    setText("deployment-commit", live.commit || "\u2013");
    setText("deployment-image", live.image || "\u2013");
    var instances = document.getElementById("deployment-instances");
    if (instances) {
      instances.replaceChildren();
      live.instances.forEach(function (text) {
        var span = document.createElement("span");
        span.className = "instance";
        span.textContent = text;
        instances.append(span, " ");
      });
    }
    setText("deployment-error", live.error || "");
    ["deployment-error", "deployment-error-term"].forEach(function (id) {
      var element = document.getElementById(id);
      if (element) { element.hidden = !live.error; }
    });
    var timeline = document.getElementById("deployment-timeline");
    if (timeline) {
      timeline.replaceChildren();
      live.timeline.forEach(function (event) {
        var item = document.createElement("li");
        var at = document.createElement("time");
        at.textContent = event.at;
        item.append(badge(event.state, event.state_label), " ", at);
        timeline.append(item);
      });
    }
  }

  // A deployment's build log: follow new lines and the state, reload once
  // it settles so the whole page is current.
  var log = document.getElementById("log");
  if (log && log.getAttribute("data-stream") && window.EventSource) {
    var stream = new EventSource(log.getAttribute("data-stream"));
    stream.addEventListener("state", function (event) { showDeployment(JSON.parse(event.data)); });
    stream.addEventListener("log", function (event) {
      var entry = JSON.parse(event.data);
      var empty = document.getElementById("log-empty");
      if (empty) { empty.remove(); }
      var line = document.createElement("span");
      line.className = "line " + (entry.stream === "stderr" ? "stderr" : "stdout");
      line.title = entry.ts;
      line.textContent = entry.line + "\n";
      var atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
      log.appendChild(line);
      if (atBottom) { log.scrollTop = log.scrollHeight; }
    });
    stream.addEventListener("end", function () { stream.close(); window.location.reload(); });
  }

  // An app's runtime log: follow the user API's stream (the session cookie
  // authenticates it), skipping the lines the page already shows.
  var runtime = document.getElementById("runtime-log");
  if (runtime && runtime.getAttribute("data-follow") && window.EventSource) {
    var after = parseInt(runtime.getAttribute("data-after"), 10) || 0;
    var follow = new EventSource(runtime.getAttribute("data-follow"));
    follow.addEventListener("log", function (event) {
      var entry = JSON.parse(event.data);
      if (entry.seq <= after) { return; }
      after = entry.seq;
      var empty = document.getElementById("runtime-log-empty");
      if (empty) { empty.remove(); }
      var line = document.createElement("span");
      line.className = "line " + (entry.stream === "stderr" ? "stderr" : "stdout");
      line.title = entry.ts + " \u00b7 " + entry.node_id + " #" + entry.instance;
      line.textContent = entry.line + "\n";
      var atBottom = runtime.scrollTop + runtime.clientHeight >= runtime.scrollHeight - 8;
      runtime.appendChild(line);
      if (atBottom) { runtime.scrollTop = runtime.scrollHeight; }
    });
    follow.addEventListener("end", function () { follow.close(); });
  }

  // A task run's output while it runs: ask the user API's logs route (the
  // session cookie opens it) for the lines after the last one shown, every
  // second; reload once the run has ended so the whole page is current.
  var runLog = document.getElementById("run-log");
  if (runLog && runLog.getAttribute("data-poll") && window.fetch) {
    var runAfter = parseInt(runLog.getAttribute("data-after"), 10) || 0;
    var poll = function () {
      fetch(runLog.getAttribute("data-poll") + "?after=" + runAfter, { credentials: "same-origin" })
        .then(function (response) {
          if (response.ok) { return response.json(); }
          return response.status === 404 ? { gone: true } : null;
        })
        .then(function (answer) {
          if (!answer) { return; }
          if (answer.gone) { return true; }
          answer.lines.forEach(function (entry) {
            if (entry.seq <= runAfter) { return; }
            runAfter = entry.seq;
            var empty = document.getElementById("run-log-empty");
            if (empty) { empty.remove(); }
            var line = document.createElement("span");
            line.className = "line " + (entry.stderr ? "stderr" : "stdout");
            line.title = entry.at;
            line.textContent = entry.line + "\n";
            var atBottom = runLog.scrollTop + runLog.clientHeight >= runLog.scrollHeight - 8;
            runLog.appendChild(line);
            if (atBottom) { runLog.scrollTop = runLog.scrollHeight; }
          });
          if (answer.lines.length === 0 && answer.run.state !== "queued" && answer.run.state !== "running") {
            window.location.reload();
            return true;
          }
        })
        .catch(function () {})
        .then(function (done) { if (!done) { window.setTimeout(poll, 1000); } });
    };
    window.setTimeout(poll, 1000);
  }

  // The header on a narrow screen: language and log-out fold behind the
  // menu button (the stylesheet hides them only once this runs).
  var header = document.querySelector("header.top");
  var menu = header && header.querySelector("button.menu");
  if (menu) {
    header.classList.add("js");
    menu.addEventListener("click", function () {
      var open = header.classList.toggle("open");
      menu.setAttribute("aria-expanded", open ? "true" : "false");
    });
  }

  // Charts: the values under the pointer (each column's title) go in the
  // readout under the chart; leaving the chart shows the latest again.
  Array.prototype.forEach.call(document.querySelectorAll("figure.chart"), function (figure) {
    var readout = figure.querySelector(".readout");
    if (!readout) { return; }
    var latest = readout.textContent;
    var current = null;
    function show(column) {
      if (current) { current.classList.remove("on"); }
      current = column;
      if (column) {
        column.classList.add("on");
        var title = column.querySelector("title");
        readout.textContent = title ? title.textContent : "";
      } else {
        readout.textContent = latest;
      }
    }
    figure.addEventListener("pointermove", function (event) {
      var column = event.target.closest && event.target.closest("rect.hover");
      if (column && column !== current) { show(column); }
    });
    figure.addEventListener("pointerleave", function () { show(null); });
  });

  // Copy buttons (the join command).
  Array.prototype.forEach.call(document.querySelectorAll("button.copy[data-copy]"), function (button) {
    if (!navigator.clipboard) { return; }
    button.hidden = false;
    button.addEventListener("click", function () {
      var target = document.getElementById(button.getAttribute("data-copy"));
      if (target) { navigator.clipboard.writeText(target.textContent); }
    });
  });
})();
