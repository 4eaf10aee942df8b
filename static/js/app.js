// GenevaDrive dashboard behaviour. No inline script anywhere (the CSP forbids it), and the
// pages work without this file: forms post, links navigate, nothing polls.
(function () {
  "use strict";

  // Live regions poll with hx-trigger="every Ns" and carry data-poll. A hidden tab does not
  // poll at all (GoodJob's approach): the request is vetoed here rather than with an htmx
  // trigger filter, because filters are evaluated with Function() and our CSP has no
  // 'unsafe-eval'. Nor does a region the operator is working in: a checked checkbox (a bulk
  // selection), a focused field, an open signal form or an open confirmation dialog. A swap
  // then would throw their input away, or detach the form a confirmed action belongs to.
  // A control the operator changed (a chosen Step, a typed payload) marks its region as being
  // edited for two minutes; the swap after their action brings a fresh, unmarked region.
  //
  // A paused refresh never goes unsaid (issue 32): the header's refresh control (#refresh,
  // Oban Web's) says "Live · updated 3 s ago", "Live updates paused: 2 rows selected",
  // "Stopped: nothing here can change any more" or "Refresh failed", and its button pauses
  // or resumes. Resume overrides the selection and editing reasons for this page (the morph
  // keeps ticked boxes, typed text and open forms anyway); pausing by hand stops every poll.
  var EDIT_GRACE_MS = 120000;
  var live = { userPaused: false, resumed: {}, stopped: {}, failed: null, lastOk: Date.now() };
  function markEdited(evt) {
    var region = evt.target.closest && evt.target.closest("[data-poll]");
    if (region) region.setAttribute("data-edited-at", String(Date.now()));
  }
  document.addEventListener("input", markEdited);
  document.addEventListener("change", markEdited);
  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }
  // Why ``region`` must not refresh now, in words, or "" when it may.
  function pauseReason(region) {
    if (live.userPaused) return "paused by you";
    if (document.querySelector("dialog[open]")) return "a dialog is open";
    var resumed = live.resumed[region.id];
    var ticked = region.querySelectorAll("input[name=ids]:checked").length;
    if (ticked && !resumed) return plural(ticked, "row") + " selected";
    var active = document.activeElement;
    if (active && region.contains(active) &&
        active.matches("input:not([type=checkbox]):not([type=radio]), select, textarea")) {
      return "a field has focus";
    }
    if (resumed) return "";
    var edited = Number(region.getAttribute("data-edited-at") || 0);
    if (edited && Date.now() - edited < EDIT_GRACE_MS) return "you changed a field here";
    if (region.querySelector("input[type=checkbox]:checked")) return "a box is ticked";
    if (region.querySelector("details.signal-form[open]")) return "a signal form is open";
    return "";
  }
  function busy(region) { return pauseReason(region) !== ""; }
  function pollRegions() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-poll]"));
  }
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var elt = evt.detail.elt;
    if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-poll")) return;
    if (document.visibilityState !== "visible" || busy(elt)) evt.preventDefault();
  });
  // A poll already in flight when the operator started editing must not land on their input.
  // (detail.elt is the swap target here; the element that asked is requestConfig.elt.)
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var source = evt.detail.requestConfig && evt.detail.requestConfig.elt;
    if (source && source.hasAttribute && source.hasAttribute("data-poll") && busy(source)) {
      evt.detail.shouldSwap = false;
    }
  });
  document.addEventListener("htmx:afterRequest", function (evt) {
    var source = evt.detail.requestConfig && evt.detail.requestConfig.elt;
    if (!source || !source.hasAttribute || !source.hasAttribute("data-poll")) return;
    var xhr = evt.detail.xhr;
    if (xhr && xhr.status === 286) live.stopped[source.id] = true;
    if (evt.detail.successful) { live.failed = null; live.lastOk = Date.now(); }
    else if (xhr && xhr.status !== 409 && xhr.status !== 400) live.failed = new Date();
    showRefresh();
  });
  document.addEventListener("htmx:sendError", function (evt) {
    var source = evt.detail.requestConfig && evt.detail.requestConfig.elt;
    if (source && source.hasAttribute && source.hasAttribute("data-poll")) live.failed = new Date();
  });
  function ago(ms) {
    var s = Math.max(0, Math.round(ms / 1000));
    return s < 60 ? s + " s ago" : Math.round(s / 60) + " min ago";
  }
  function showRefresh() {
    var box = document.getElementById("refresh");
    if (!box) return;
    var text = document.getElementById("refresh-text");
    var toggle = document.getElementById("refresh-toggle");
    var regions = pollRegions().filter(function (r) { return !live.stopped[r.id]; });
    var state, message;
    if (!regions.length) {
      state = "none";
      message = pollRegions().length || Object.keys(live.stopped).length
        ? "Stopped: nothing here can change any more" : "Not live: this page does not refresh";
    } else if (live.userPaused) {
      state = "paused"; message = "Live updates paused by you";
    } else {
      var reasons = regions.map(pauseReason).filter(function (r) { return r; });
      if (reasons.length) {
        state = "paused"; message = "Live updates paused: " + reasons[0];
      } else if (live.failed) {
        state = "error";
        message = "Refresh failed at " + live.failed.toLocaleTimeString() +
          "; the data shown is stale (from " + ago(Date.now() - live.lastOk) + "); retrying";
      } else {
        state = "live"; message = "Live · updated " + ago(Date.now() - live.lastOk);
      }
    }
    box.hidden = false;
    box.setAttribute("data-state", state);
    // Stale numbers never look live: the polled regions are dimmed until a refresh succeeds.
    pollRegions().forEach(function (region) {
      if (state === "error") region.setAttribute("data-stale", "");
      else region.removeAttribute("data-stale");
    });
    // At phone width the control is fixed at the bottom: leave room for all of it under the
    // page (a CSSOM property, which the CSP allows, unlike a style attribute).
    if (window.getComputedStyle(box).position === "fixed") {
      document.documentElement.style.setProperty("--refresh-room", (box.offsetHeight + 24) + "px");
    }
    if (text.textContent !== message) text.textContent = message;
    toggle.hidden = state === "none";
    toggle.textContent = state === "paused" ? "Resume" : "Pause";
    toggle.setAttribute("aria-label", state === "paused" ? "Resume live updates" : "Pause live updates");
  }
  function refreshNow(region) {
    if (!window.htmx || !region.getAttribute("hx-get")) return;
    window.htmx.ajax("GET", region.getAttribute("hx-get"), {
      source: region, target: region, swap: region.getAttribute("hx-swap") || "morph"
    });
  }
  document.addEventListener("click", function (evt) {
    if (!evt.target.closest || !evt.target.closest("#refresh-toggle")) return;
    var box = document.getElementById("refresh");
    if (box.getAttribute("data-state") === "paused") {
      live.userPaused = false;
      pollRegions().forEach(function (region) {
        live.resumed[region.id] = true;
        region.removeAttribute("data-edited-at");
        refreshNow(region);
      });
    } else {
      live.userPaused = true;
    }
    showRefresh();
  });
  document.addEventListener("DOMContentLoaded", function () {
    live.lastOk = Date.now();
    showRefresh();
    setInterval(showRefresh, 1000);
  });

  // The colour scheme switch: auto (the system's) → light → dark → auto, kept in
  // localStorage; static/js/theme.js applies it before the first paint of the next page.
  var THEMES = ["auto", "light", "dark"];
  function currentTheme() {
    return document.documentElement.getAttribute("data-theme") || "auto";
  }
  function showTheme() {
    var button = document.getElementById("theme-switch");
    if (!button) return;
    button.hidden = false;
    // "Theme: " folds away at phone width (.theme-word); the button keeps its full name.
    var word = document.createElement("span");
    word.className = "theme-word";
    word.textContent = "Theme: ";
    button.textContent = "";
    button.appendChild(word);
    button.appendChild(document.createTextNode(currentTheme()));
  }
  document.addEventListener("click", function (evt) {
    if (!evt.target.closest || !evt.target.closest("#theme-switch")) return;
    var next = THEMES[(THEMES.indexOf(currentTheme()) + 1) % THEMES.length];
    if (next === "auto") document.documentElement.removeAttribute("data-theme");
    else document.documentElement.setAttribute("data-theme", next);
    try {
      if (next === "auto") window.localStorage.removeItem("geneva-theme");
      else window.localStorage.setItem("geneva-theme", next);
    } catch (e) { /* storage disabled: this page only */ }
    showTheme();
  });
  document.addEventListener("DOMContentLoaded", showTheme);

  // Confirmation dialogs: hx-confirm opens a <dialog> whose confirm button repeats the
  // action and names its object (data-confirm-label, e.g. "Cancel workflow #41"), instead of
  // the browser's OK/Cancel box. "{step}" in the question or label is the form's chosen Step.
  // A destructive action (data-confirm-danger) gets a red button and the dialog opens with
  // focus on Back, so Enter-Enter never cancels anything.
  function fillStep(text, source) {
    var select = source.querySelector && source.querySelector("select[name=step]");
    return text.split("{step}").join(select ? select.value : "");
  }
  document.addEventListener("htmx:confirm", function (evt) {
    var question = evt.detail.question;
    if (!question) return;
    evt.preventDefault();
    var source = evt.detail.elt;
    question = fillStep(question, source);
    var dialog = document.getElementById("confirm-dialog");
    if (!dialog || typeof dialog.showModal !== "function") {
      if (window.confirm(question)) evt.detail.issueRequest(true);
      return;
    }
    var label = (source.getAttribute && source.getAttribute("data-confirm-label")) || "Confirm";
    var danger = !!(source.hasAttribute && source.hasAttribute("data-confirm-danger"));
    dialog.querySelector("[data-confirm-question]").textContent = question;
    var ok = dialog.querySelector("[data-confirm-ok]");
    ok.textContent = fillStep(label, source);
    ok.classList.toggle("danger", danger);
    dialog.returnValue = "";
    dialog.addEventListener("close", function onClose() {
      dialog.removeEventListener("close", onClose);
      if (dialog.returnValue === "confirm") evt.detail.issueRequest(true);
    });
    dialog.showModal();
    (danger ? dialog.querySelector("[data-confirm-back]") : ok).focus();
  });

  // Bulk previews and results are swapped into #bulk-preview, inside #bulk-dialog: open it
  // (wherever the operator scrolled to) and focus its [data-autofocus] button.
  document.addEventListener("htmx:afterSwap", function (evt) {
    var target = evt.detail.target;
    if (!target || target.id !== "bulk-preview") return;
    var dialog = document.getElementById("bulk-dialog");
    if (!dialog) return;
    if (!dialog.open) dialog.showModal();
    var first = target.querySelector("[data-autofocus]");
    if (first) first.focus();
  });
  document.addEventListener("click", function (evt) {
    var closer = evt.target.closest && evt.target.closest("[data-close-dialog]");
    if (!closer) return;
    var dialog = closer.closest("dialog");
    if (!dialog) return; // the no-script page: the link navigates back
    evt.preventDefault();
    dialog.close();
  });
  document.addEventListener("close", function (evt) {
    if (evt.target.id === "bulk-dialog") document.getElementById("bulk-preview").innerHTML = "";
  }, true);

  // Refreshes morph (idiomorph) instead of replacing: what the operator set is theirs. An open
  // <details> (a backtrace, a payload) stays open, a ticked checkbox or radio stays ticked, a
  // chosen option stays chosen and typed text stays; idiomorph keeps focus and scroll itself.
  // Only polls morph: an action's answer replaces its region with the server's state.
  function keepOperatorState(attr, elt) {
    if ((attr === "open" || attr === "data-folded") && elt.tagName === "DETAILS") return false;
    if (attr === "checked" || attr === "selected") return false;
    if (attr === "value" && elt.matches && elt.matches("input:not([type=hidden]), textarea")) return false;
    return true;
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (window.Idiomorph) Idiomorph.defaults.callbacks.beforeAttributeUpdated = keepOperatorState;
  });

  // Engine messages mark step and error names with backticks; show those as <code>, the
  // rest as text (never as HTML).
  function appendCodeText(parent, text) {
    String(text).split("`").forEach(function (part, i) {
      if (!part) return;
      if (i % 2) {
        var code = document.createElement("code");
        code.textContent = part;
        parent.appendChild(code);
      } else {
        parent.appendChild(document.createTextNode(part));
      }
    });
  }

  // Toasts from the HX-Trigger header of action responses.
  function toast(message, ok) {
    var region = document.getElementById("toasts");
    if (!region) return;
    var item = document.createElement("div");
    item.className = "toast " + (ok ? "toast-ok" : "toast-bad");
    appendCodeText(item, message);
    region.appendChild(item);
    setTimeout(function () { item.remove(); }, 6000);
  }
  document.body.addEventListener("geneva:toast", function (evt) {
    toast(evt.detail.message, evt.detail.ok);
  });
  // Errors htmx does not swap (403, 500, network): say so instead of failing silently.
  document.body.addEventListener("htmx:responseError", function (evt) {
    var xhr = evt.detail.xhr;
    if (xhr.status === 400 || xhr.status === 409) return; // swapped inline
    toast(xhr.responseText ? xhr.responseText.slice(0, 300) : "Request failed (" + xhr.status + ")", false);
  });
  document.body.addEventListener("htmx:sendError", function () {
    toast("The dashboard could not be reached. It will retry.", false);
  });

  // "Select all on this page" for bulk actions.
  document.addEventListener("change", function (evt) {
    var box = evt.target;
    if (!box.matches || !box.matches("[data-select-page]")) return;
    document.querySelectorAll("input[name=ids]").forEach(function (item) {
      item.checked = box.checked;
    });
  });

  // The signal inbox: a group's header box ticks its waiters; ticking a waiter fills the bulk
  // form's Name with the signal it waits for, unless the operator typed a Name themselves.
  document.addEventListener("change", function (evt) {
    var box = evt.target;
    if (!box.matches) return;
    if (box.matches("[data-select-group]")) {
      var group = box.closest("section");
      if (!group) return;
      group.querySelectorAll("input[name=ids]").forEach(function (item) {
        item.checked = box.checked;
      });
      var first = group.querySelector("input[name=ids][data-signal]");
      if (first && box.checked) fillSignalName(first);
    } else if (box.matches("input[name=ids][data-signal]") && box.checked) {
      fillSignalName(box);
    }
  });
  function fillSignalName(box) {
    var name = document.getElementById("bulk-sig-name");
    if (!name || name.hasAttribute("data-typed")) return;
    name.value = box.getAttribute("data-signal");
  }
  document.addEventListener("input", function (evt) {
    if (evt.target.id === "bulk-sig-name") evt.target.setAttribute("data-typed", "");
  });

  // Show the times in the operator's own zone next to UTC (titles keep UTC).
  function localize(root) {
    (root || document).querySelectorAll("[data-local-time]").forEach(function (elt) {
      var when = new Date(elt.getAttribute("datetime"));
      if (isNaN(when)) return;
      elt.setAttribute("title", elt.getAttribute("title") + " · " + when.toLocaleString());
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localize(document); });

  // At phone width the filters and the bulk bar start folded, so the list is on the first
  // screen; their summaries open them. (Open by default: without script nothing is hidden.)
  function foldNarrow(root) {
    if (!window.matchMedia || !window.matchMedia("(max-width: 600px)").matches) return;
    (root || document).querySelectorAll("details[data-collapse-narrow]").forEach(function (d) {
      if (!d.hasAttribute("data-folded")) { d.open = false; d.setAttribute("data-folded", ""); }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    foldNarrow(document);
    // Arrived by "/" from another page: the search field, unfolded, has the focus.
    var search = window.location.hash === "#search" && document.getElementById("f-q");
    if (search) {
      var folded = search.closest("details");
      if (folded) folded.open = true;
      search.focus();
    }
  });
  document.body.addEventListener("htmx:afterSwap", function (evt) {
    localize(evt.detail.target);
    foldNarrow(evt.detail.target.parentNode || document);
  });

  // Above 100 workflows a bulk confirm asks for the count to be typed (DASHBOARD.md): its
  // button stays disabled until the field holds exactly that number (the server checks too).
  function checkTyped(input) {
    var form = input.form;
    var button = form && form.querySelector("button[type=submit]");
    if (!button) return;
    var typed = input.value.replace(/[\s,._']/g, "").toLowerCase();
    button.disabled = typed !== input.getAttribute("data-expected");
  }
  document.addEventListener("input", function (evt) {
    if (evt.target.matches && evt.target.matches("[data-typed-confirm]")) checkTyped(evt.target);
  });
  document.body.addEventListener("htmx:afterSwap", function (evt) {
    evt.detail.target.querySelectorAll("[data-typed-confirm]").forEach(checkTyped);
  });
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-typed-confirm]").forEach(checkTyped);
  });

  // Keyboard shortcuts (Oban Web's): j/k move through the list's rows, x ticks the row, /
  // goes to the search field, ? shows them all. Not while typing in a field or a dialog is open.
  var kbRow = -1;
  function listRows() {
    return Array.prototype.slice.call(document.querySelectorAll("#results tbody tr[id^=wf-]"));
  }
  function markRow() {
    var rows = listRows();
    rows.forEach(function (row, i) { row.classList.toggle("kb-current", i === kbRow); });
    return rows[kbRow];
  }
  function moveRow(step) {
    var rows = listRows();
    if (!rows.length) return;
    kbRow = Math.max(0, Math.min(rows.length - 1, kbRow + step));
    var row = markRow();
    var link = row.querySelector("td[data-label=Id] a") || row.querySelector("a");
    if (link) link.focus();
    row.scrollIntoView({ block: "nearest" });
  }
  document.body.addEventListener("htmx:afterSwap", function () { if (kbRow >= 0) markRow(); });
  document.addEventListener("keydown", function (evt) {
    if (evt.ctrlKey || evt.metaKey || evt.altKey) return;
    var target = evt.target;
    if (target.matches && target.matches("input, select, textarea, [contenteditable]")) return;
    var help = document.getElementById("kbd-help");
    if (document.querySelector("dialog[open]")) return;
    if (evt.key === "?") {
      if (help && typeof help.showModal === "function") { evt.preventDefault(); help.showModal(); }
    } else if (evt.key === "/") {
      var search = document.getElementById("f-q");
      evt.preventDefault();
      if (!search) {
        // Every page: the search is on the workflows list, opened with its field focused.
        var list = document.body.getAttribute("data-search-url");
        if (list) window.location.assign(list + "#search");
        return;
      }
      var folded = search.closest("details");
      if (folded) folded.open = true;
      search.focus();
    } else if ((evt.key === "j" || evt.key === "k") && listRows().length) {
      evt.preventDefault();
      moveRow(evt.key === "j" ? 1 : -1);
    } else if (evt.key === "x" && kbRow >= 0) {
      var row = markRow();
      var box = row && row.querySelector("input[name=ids]");
      if (!box) return;
      evt.preventDefault();
      box.checked = !box.checked;
      box.dispatchEvent(new Event("change", { bubbles: true }));
    }
  });
})();
