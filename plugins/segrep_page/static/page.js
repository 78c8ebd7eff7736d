// segrep replication page: the lag charts (Chart.js, vendored in this folder) and links that open Airflow's
// own pages in the whole window rather than inside the plugin's frame.
(function () {
  "use strict";
  var series = JSON.parse(document.getElementById("lag-data").textContent);
  var charts = {};
  window.segrepCharts = charts;

  function label(ms) {
    return new Date(ms).toISOString().slice(5, 16).replace("T", " ");
  }

  function draw(windowS) {
    series.filter(function (s) { return s.window_s === windowS; }).forEach(function (s) {
      var canvas = document.getElementById("lag-" + s.table + "-" + s.site);
      if (!canvas) { return; }
      var start = s.now_ms - s.window_s * 1000;
      var datasets = [{
        label: "lag (s)",
        data: s.points.map(function (p) { return { x: p[0], y: p[1], status: p[3] }; }),
        borderColor: "#1565c0", backgroundColor: "#1565c0", pointRadius: 2, borderWidth: 1.5, tension: 0,
      }];
      if (s.rpo_s !== null) {
        datasets.push({
          label: "RPO (" + s.rpo_s + " s)", data: [{ x: start, y: s.rpo_s }, { x: s.now_ms, y: s.rpo_s }],
          borderColor: "#c62828", borderDash: [6, 4], pointRadius: 0, borderWidth: 1.5,
        });
      }
      if (charts[canvas.id]) { charts[canvas.id].destroy(); }
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
              afterLabel: function (item) { return item.raw.status ? "round: " + item.raw.status : ""; },
            } },
          },
        },
      });
      canvas.dataset.points = String(s.points.length);
      canvas.dataset.window = String(windowS);
    });
  }

  document.querySelectorAll("button.window").forEach(function (button) {
    button.addEventListener("click", function () {
      document.querySelectorAll("button.window").forEach(function (b) { b.setAttribute("aria-pressed", "false"); });
      button.setAttribute("aria-pressed", "true");
      draw(Number(button.dataset.window));
    });
  });

  // Inside the Airflow UI this page is a sandboxed frame that may not navigate the top window; the UI's router
  // follows its own history, so a link to an Airflow page is pushed there (same origin) and the UI shows it.
  document.addEventListener("click", function (event) {
    var a = event.target.closest && event.target.closest("a[href]");
    if (!a || window.top === window || a.getAttribute("href").indexOf("/dags/") < 0) { return; }
    try {
      window.top.history.pushState(null, "", a.href);
      window.top.dispatchEvent(new PopStateEvent("popstate"));
      event.preventDefault();
    } catch (e) { /* not the same origin: follow the link in the frame */ }
  });

  draw(86400);
  document.body.dataset.chartsReady = "true";
})();
