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
  var EDIT_GRACE_MS = 120000;
  function markEdited(evt) {
    var region = evt.target.closest && evt.target.closest("[data-poll]");
    if (region) region.setAttribute("data-edited-at", String(Date.now()));
  }
  document.addEventListener("input", markEdited);
  document.addEventListener("change", markEdited);
  function busy(region) {
    var edited = Number(region.getAttribute("data-edited-at") || 0);
    if (edited && Date.now() - edited < EDIT_GRACE_MS) return true;
    if (document.querySelector("dialog[open]")) return true;
    if (region.querySelector("input[type=checkbox]:checked, details.signal-form[open]")) return true;
    var active = document.activeElement;
    return !!(active && region.contains(active) && active.matches("input, select, textarea"));
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
  document.addEventListener("DOMContentLoaded", function () { foldNarrow(document); });
  document.body.addEventListener("htmx:afterSwap", function (evt) {
    localize(evt.detail.target);
    foldNarrow(evt.detail.target.parentNode || document);
  });
})();
