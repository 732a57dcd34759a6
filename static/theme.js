// The colour theme, before the first paint: "light" or "dark" when the person chose one
// with the toggle (remembered in localStorage), else the system's prefers-color-scheme
// (static/sectr.css). Loaded without defer from <head>; no inline script (strict CSP).
(function () {
  "use strict";
  try {
    const chosen = localStorage.getItem("sectr-theme");
    if (chosen === "light" || chosen === "dark") document.documentElement.dataset.theme = chosen;
  } catch (e) {
    // Storage may be disabled: the system theme applies.
  }
})();
