// The New session form's Agent picker follows its Team picker: it offers the
// installation-wide agents and the chosen team's, and preselects that team's first agent
// (the server's default too; it refuses an agent of another team whatever is sent).
(function () {
  "use strict";

  function follow(teamSelect, agentSelect) {
    const team = teamSelect.value;
    let first = null;
    for (const group of agentSelect.querySelectorAll("optgroup")) {
      const own = group.dataset.team === "" || group.dataset.team === team;
      group.hidden = !own;
      group.disabled = !own;
      if (own && team && group.dataset.team === team && !first) {
        first = group.querySelector("option");
      }
    }
    const chosen = agentSelect.selectedOptions[0];
    if (first) {
      first.selected = true;
    } else if (chosen && chosen.parentElement.disabled) {
      agentSelect.value = "";
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    const agentSelect = document.querySelector("[data-agent-picker]");
    const teamSelect = document.getElementById("new_team");
    if (!agentSelect || !teamSelect) {
      return;
    }
    teamSelect.addEventListener("change", function () {
      follow(teamSelect, agentSelect);
    });
    follow(teamSelect, agentSelect);
  });
})();
