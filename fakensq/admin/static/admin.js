// fakensq admin: live sections and actions, no dependencies, no build step.
//
// Every <section data-live> of a page is re-rendered by the server; this polls
// /api/live/<page path> once a second and swaps in what changed.  Buttons and
// forms with data-action ask for confirmation, POST to /api/action, and show the
// result in #flash.
(function () {
  "use strict";
  var POLL_MS = 1000;
  var live = document.getElementById("live");
  var flash = document.getElementById("flash");
  var busy = false;
  // Every URL is under <base href> (nsqadmin's --base-path).
  var baseEl = document.querySelector("base");
  var base = (baseEl && baseEl.getAttribute("href")) || "/";

  function livePath() {
    var page = window.location.pathname;
    if (page + "/" === base) page = base; // the base path itself: the topics page
    page = page.indexOf(base) === 0 ? page.slice(base.length) : page.replace(/^\//, "");
    return base + "api/live/" + (page || "topics");
  }

  function refresh() {
    if (busy) return Promise.resolve();
    busy = true;
    return fetch(livePath(), { cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (doc) {
        var ids = Object.keys(doc.sections);
        ids.forEach(function (id) {
          var el = document.getElementById(id);
          if (el && el.innerHTML !== doc.sections[id]) el.innerHTML = doc.sections[id];
        });
        // A section the server no longer renders (its topic is gone): clear it.
        document.querySelectorAll("section[data-live]").forEach(function (el) {
          if (!(el.id in doc.sections)) el.innerHTML = "";
        });
        // A section the page did not have (a topic that came into existence): reload.
        if (ids.some(function (id) { return !document.getElementById(id); })) {
          window.location.reload();
        }
        live.textContent = "live · " + new Date().toLocaleTimeString();
        live.className = "muted";
      })
      .catch(function (err) {
        live.textContent = "admin server unreachable (" + err.message + ")";
        live.className = "bad";
      })
      .finally(function () { busy = false; });
  }

  function show(ok, message) {
    flash.hidden = false;
    flash.className = ok ? "ok" : "bad";
    flash.textContent = message;
  }

  function act(args, button) {
    if (button) button.disabled = true;
    show(true, "working: " + args.action + "…");
    return fetch(base + "api/action", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(args),
    })
      .then(function (r) { return r.json(); })
      .then(function (res) {
        show(res.ok, res.message);
        if (res.ok && res.redirect) {
          window.location.href = res.redirect;
          return;
        }
        busy = false;
        return refresh();
      })
      .catch(function (err) { show(false, args.action + " failed: " + err.message); })
      .finally(function () { if (button) button.disabled = false; });
  }

  function fill(template, args) {
    return template.replace(/\{(\w+)\}/g, function (_, k) { return args[k] || ""; });
  }

  document.addEventListener("click", function (ev) {
    var button = ev.target.closest("button[data-action]");
    if (!button) return;
    var args = Object.assign({}, button.dataset);
    delete args.confirm;
    if (!window.confirm(button.dataset.confirm || "Are you sure?")) return;
    act(args, button);
  });

  document.addEventListener("submit", function (ev) {
    var form = ev.target.closest("form[data-action]");
    if (!form) return;
    ev.preventDefault();
    var args = Object.assign({}, form.dataset);
    delete args.confirm;
    new FormData(form).forEach(function (value, key) {
      if (value) args[key] = value;
    });
    if (!window.confirm(fill(form.dataset.confirm || "Are you sure?", args))) return;
    act(args, form.querySelector("button")).then(function () { form.reset(); });
  });

  window.setInterval(refresh, POLL_MS);
})();
