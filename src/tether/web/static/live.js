// The operator page's only script: live expiry countdowns and a quiet refresh
// (conditional: a page that is unchanged is answered 304 and left alone).
// It loads nothing from elsewhere and sends nothing but same-origin GETs.
(function () {
  "use strict";

  function remaining(ms) {
    var s = Math.floor(ms / 1000);
    var m = Math.floor(s / 60);
    return m > 0 ? m + " min " + (s % 60) + " s left" : s + " s left";
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-expires]").forEach(function (el) {
      var at = el.getAttribute("data-expires");
      if (!at) {
        el.textContent = "(no readable expiry)";
        return;
      }
      var left = Number(at) - now;
      el.textContent = left > 0 ? remaining(left) : "expired";
      el.classList.toggle("expired", left <= 0);
    });
  }

  function busy() {
    // Never swap the page under someone typing or choosing in a form.
    var el = document.activeElement;
    return el && el !== document.body && el.closest && el.closest("form");
  }

  // The version of the page shown: a page that has one (the runs list) answers
  // 304 when nothing it shows changed, and nothing is sent or swapped.
  var shown = null;

  async function refresh() {
    if (busy() || document.hidden) return;
    var response;
    var headers = shown ? { "If-None-Match": shown } : {};
    try {
      response = await fetch(location.href, {
        credentials: "same-origin",
        cache: "no-store",
        headers: headers,
      });
    } catch (e) {
      return;
    }
    if (response.status === 304) {
      tick();
      return;
    }
    if (!response.ok) return;
    shown = response.headers.get("ETag");
    var doc = new DOMParser().parseFromString(await response.text(), "text/html");
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var fresh = doc.getElementById(el.id);
      if (fresh && fresh.innerHTML !== el.innerHTML) el.innerHTML = fresh.innerHTML;
    });
    tick();
  }

  document.addEventListener("DOMContentLoaded", function () {
    shown = document.body.getAttribute("data-etag");
    tick();
    setInterval(tick, 1000);
    var every = Number(document.body.getAttribute("data-refresh") || 0);
    if (every > 0) setInterval(refresh, every * 1000);
  });
})();
