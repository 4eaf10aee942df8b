// The colour scheme, applied before the first paint (this file loads without defer, in <head>):
// the operator's choice from the header switch (localStorage "geneva-theme": "light" or
// "dark"), else the system's prefers-color-scheme (the stylesheet's media query). No inline
// script: the CSP forbids it.
(function () {
  "use strict";
  try {
    var chosen = window.localStorage.getItem("geneva-theme");
    if (chosen === "light" || chosen === "dark") {
      document.documentElement.setAttribute("data-theme", chosen);
    }
  } catch (e) {
    // Storage disabled (private mode, policy): the system's scheme applies.
  }
})();
