/* The console's behaviour: copy buttons and Chart.js charts (drawn again after each htmx swap). */
(function () {
  "use strict";

  // Distinct hues dark enough for 3:1 against white (Okabe-Ito based); grey for "other adapters".
  var PALETTE = ["#0072b2", "#b35c00", "#00785a", "#a4457c", "#6a4c93", "#c0392b", "#00838f", "#7a6200"];
  var OTHER = "other adapters";
  var OTHER_COLOUR = "#9aa3ad";

  function announce(button, text) {
    var original = button.dataset.label || button.textContent;
    button.dataset.label = original;
    button.textContent = text;
    setTimeout(function () { button.textContent = original; }, 2000);
  }

  function copy(button) {
    var source = document.querySelector(button.dataset.copy);
    if (!source) return;
    var text = "value" in source ? source.value : source.textContent;
    var done = function () { announce(button, "Copied"); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallbackCopy(source, text, done); });
    } else {
      fallbackCopy(source, text, done);
    }
  }

  function fallbackCopy(source, text, done) {
    // Plain http (no clipboard API): select the text and use the legacy copy command.
    var field = document.createElement("textarea");
    field.value = text;
    field.setAttribute("readonly", "");
    field.style.position = "fixed";
    field.style.opacity = "0";
    document.body.appendChild(field);
    field.select();
    var ok = document.execCommand("copy");
    document.body.removeChild(field);
    if (ok) done();
    else if (source.select) source.select();
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (button) copy(button);
  });

  function colour(label, index) {
    return label === OTHER ? OTHER_COLOUR : PALETTE[index % PALETTE.length];
  }

  function shortDay(iso) {
    return new Date(iso + "T00:00:00Z").toLocaleDateString("en", { month: "short", day: "numeric", timeZone: "UTC" });
  }

  var dayAxis = { ticks: { maxRotation: 0, autoSkip: true, autoSkipPadding: 12 } };

  function stackedChart(data, metric) {
    return {
      type: "bar",
      data: {
        labels: data.days.map(shortDay),
        datasets: data.series.map(function (label, i) {
          return { label: label, data: data[metric][label], backgroundColor: colour(label, i), stack: "usage" };
        }),
      },
      options: {
        scales: { x: Object.assign({ stacked: true }, dayAxis), y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } },
        plugins: { legend: { position: "bottom" } },
      },
    };
  }

  function latencyChart(data) {
    var line = function (label, values, colour, dash) {
      return { label: label, data: values, borderColor: colour, backgroundColor: colour, borderDash: dash,
               spanGaps: false, pointRadius: 3, tension: 0 };
    };
    return {
      type: "line",
      data: { labels: data.days.map(shortDay), datasets: [line("p50", data.p50, "#0072b2", []), line("p95", data.p95, "#b35c00", [6, 4])] },
      options: {
        scales: { x: dayAxis, y: { beginAtZero: true, title: { display: true, text: "milliseconds" } } },
        plugins: { legend: { position: "bottom" } },
      },
    };
  }

  function barsChart(data) {
    return {
      type: "bar",
      data: { labels: data.labels, datasets: [{ label: "tokens", data: data.tokens, backgroundColor: "#0072b2" }] },
      options: { indexAxis: "y", plugins: { legend: { display: false } }, scales: { x: { beginAtZero: true } } },
    };
  }

  function draw(canvas) {
    var source = document.getElementById(canvas.dataset.source);
    if (!source || !window.Chart) return;
    var data = JSON.parse(source.textContent);
    var existing = window.Chart.getChart(canvas);
    if (existing) existing.destroy();
    var kind = canvas.dataset.chart;
    var config = kind === "stacked" ? stackedChart(data, canvas.dataset.metric)
      : kind === "latency" ? latencyChart(data) : barsChart(data);
    config.options.animation = false;  // no motion, and charts are complete the moment they appear
    config.options.maintainAspectRatio = false;
    config.options.responsive = true;
    new window.Chart(canvas, config);
  }

  function drawAll() {
    document.querySelectorAll("canvas[data-chart]").forEach(draw);
  }

  document.addEventListener("DOMContentLoaded", drawAll);
  document.addEventListener("htmx:afterSettle", drawAll);
})();
