// kinbox console: the only script. Served from /static (the Content-Security-Policy allows
// nothing else): it refreshes the live parts of a page and asks before an action runs.
// The pages work without it, only not live and without the confirmations.
"use strict";

(function () {
  // An element with data-live="/partials/..." is fetched again every data-every seconds
  // (and not while the tab is hidden). The server renders that HTML with every value
  // escaped, so it replaces the element's content as it is.
  function live(element) {
    const url = element.getAttribute("data-live");
    const every = Math.max(2, Number(element.getAttribute("data-every")) || 10) * 1000;
    async function refresh() {
      if (document.hidden) return;
      try {
        const answer = await fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } });
        if (answer.redirected || answer.status === 401) { window.location.reload(); return; }
        if (!answer.ok) return;
        element.innerHTML = await answer.text();
        element.setAttribute("data-refreshed", new Date().toISOString());
      } catch (_) {
        // The console restarting or the network away: try again next time.
      }
    }
    window.setInterval(refresh, every);
  }

  // A form with data-confirm="..." asks first.
  function confirming(event) {
    const form = event.target;
    const question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(live);
    document.addEventListener("submit", confirming, true);
  });
})();
