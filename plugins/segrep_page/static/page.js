// segrep replication page: the lag charts (Chart.js, vendored in this folder), the auto-refresh, the chart's
// window, and links that open Airflow's own pages in the whole window rather than inside the plugin's frame.
//
// A refresh (every 30 s unless turned off; the choice is kept in localStorage) and a window switch fetch this
// same page from the server and swap its <main>: one renderer (the server's), and a failed refresh leaves the
// last numbers in place, dimmed, under a red line saying why and since when.
(function () {
  "use strict";
  var STORE_KEY = "segrep.autoRefresh";
  var charts = {};
  var busy = false;
  var queued = null; // asked for while a refresh was under way: fetched next
  var refreshes = 0;
  window.segrepCharts = charts;

  function label(ms) {
    return new Date(ms).toISOString().slice(5, 16).replace("T", " ");
  }

  function draw() {
    Object.keys(charts).forEach(function (id) { charts[id].destroy(); delete charts[id]; });
    var series = JSON.parse(document.getElementById("lag-data").textContent);
    series.forEach(function (s) {
      var canvas = document.getElementById("lag-" + s.table + "-" + s.site);
      if (!canvas) { return; }
      var start = s.now_ms - s.window_s * 1000;
      var data = s.points.map(function (p) { return { x: p[0], y: p[1], status: p[3] }; });
      if (s.live) { data.push({ x: s.live[0], y: s.live[1], status: null, live: true }); }
      var datasets = [{
        label: "lag (s)", data: data, borderColor: "#1565c0", backgroundColor: "#1565c0", borderWidth: 1.5, tension: 0,
        pointRadius: function (ctx) { return ctx.raw && ctx.raw.live ? 5 : 2; },
        pointStyle: function (ctx) { return ctx.raw && ctx.raw.live ? "rectRot" : "circle"; },
      }];
      if (s.rpo_s !== null) {
        datasets.push({
          label: "RPO (" + s.rpo_s + " s)", data: [{ x: start, y: s.rpo_s }, { x: s.now_ms, y: s.rpo_s }],
          borderColor: "#c62828", borderDash: [6, 4], pointRadius: 0, borderWidth: 1.5,
        });
      }
      charts[canvas.id] = new Chart(canvas, {
        type: "line",
        data: { datasets: datasets },
        options: {
          animation: false, parsing: true, responsive: true,
          scales: {
            x: { type: "linear", min: start, max: s.now_ms, ticks: { maxTicksLimit: 8, callback: label } },
            y: { beginAtZero: true, title: { display: true, text: "seconds behind" } },
          },
          plugins: {
            tooltip: { callbacks: {
              title: function (items) { return new Date(items[0].parsed.x).toISOString(); },
              afterLabel: function (item) {
                if (item.raw.live) { return "now (against the safe time)"; }
                return item.raw.status ? "round: " + item.raw.status : "";
              },
            } },
          },
        },
      });
      canvas.dataset.points = String(s.points.length);
      canvas.dataset.live = s.live ? "true" : "false";
      canvas.dataset.window = String(s.window_s);
    });
    document.body.dataset.chartsReady = "true";
  }

  function say(text, bad) {
    var status = document.getElementById("refresh-status");
    status.textContent = text;
    status.className = bad ? "problem" : "muted";
  }

  // Fetch the page at `url`, swap its <main> in; on any failure keep the old one, dimmed, and say why.
  function refresh(url) {
    if (busy) { queued = url || queued || window.location.href; return Promise.resolve(); }
    busy = true;
    var target = url || window.location.href;
    return fetch(target, { credentials: "same-origin", cache: "no-store", headers: { Accept: "text/html" } })
      .then(function (response) {
        return response.text().then(function (text) {
          var doc = new DOMParser().parseFromString(text, "text/html");
          var fresh = doc.getElementById("live");
          if (!fresh) {
            var why = doc.querySelector(".problem");
            throw new Error(why ? why.textContent : response.redirected
              ? "not logged in any more: reload the page to log in" : "HTTP " + response.status);
          }
          if (url) { window.history.replaceState(null, "", url); }
          document.getElementById("live").replaceWith(document.importNode(fresh, true));
          draw();
          refreshes += 1;
          document.body.dataset.refreshes = String(refreshes);
          say("refreshed " + new Date().toISOString().slice(11, 19) + " UTC", false);
        });
      })
      .catch(function (error) {
        var live = document.getElementById("live");
        live.classList.add("stale");
        say("refresh failed (" + error.message + "): the numbers below are as of " + live.dataset.generated, true);
      })
      .then(function () {
        busy = false;
        if (queued) { var next = queued; queued = null; refresh(next === window.location.href ? undefined : next); }
      });
  }
  window.segrepRefresh = refresh;

  function stored() {
    try { return window.localStorage.getItem(STORE_KEY); } catch (e) { return null; }
  }

  function store(value) {
    try { window.localStorage.setItem(STORE_KEY, value); } catch (e) { /* a frame without storage: not kept */ }
  }

  var toggle = document.getElementById("auto-refresh");
  toggle.checked = stored() !== "off";
  toggle.addEventListener("change", function () {
    store(toggle.checked ? "on" : "off");
    if (toggle.checked) { refresh(); } else { say("auto-refresh off", false); }
  });
  var period = Number(document.getElementById("live").dataset.refreshS || "30") * 1000;
  window.setInterval(function () {
    if (toggle.checked && !document.hidden) { refresh(); }
  }, period);

  document.addEventListener("click", function (event) {
    var a = event.target.closest && event.target.closest("a[href]");
    if (!a) { return; }
    // The chart's window: the same page with ?window=..., fetched and swapped in (and kept in the address).
    if (a.classList.contains("window") && !(event.ctrlKey || event.metaKey || event.shiftKey)) {
      event.preventDefault();
      refresh(a.href);
      return;
    }
    // Inside the Airflow UI this page is a sandboxed frame that may not navigate the top window; the UI's router
    // follows its own history, so a link to an Airflow page is pushed there (same origin) and the UI shows it.
    if (window.top === window || a.getAttribute("href").indexOf("/dags/") < 0) { return; }
    try {
      window.top.history.pushState(null, "", a.href);
      window.top.dispatchEvent(new PopStateEvent("popstate"));
      event.preventDefault();
    } catch (e) { /* not the same origin: follow the link in the frame */ }
  });

  draw();
})();
