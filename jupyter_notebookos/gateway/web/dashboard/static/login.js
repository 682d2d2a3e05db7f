// The dashboard without a (valid) token: ask for it, then open the dashboard with it in the address, which the
// dashboard takes out at once. A token this tab was given before (the dashboard keeps it in sessionStorage) is
// used again without asking: a reload of the dashboard lands here, since its address no longer holds the token.
"use strict";

(function () {
  const params = new URLSearchParams(window.location.search);
  const kept = sessionStorage.getItem("notebookos-token");

  function open(token) {
    params.set("token", token);
    window.location.replace(window.location.pathname + "?" + params.toString());
  }

  if (kept && !params.has("token")) {
    open(kept);  // (a kept token that is refused comes back here with ?token=: then the form is shown)
    return;
  }
  if (params.has("token")) {
    sessionStorage.removeItem("notebookos-token");  // refused: do not try it again
  }
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = document.getElementById("token").value.trim();
    if (token) open(token);
  });
})();
