// Progressive enhancement only: the citation fields are selectable without it.
(function () {
  "use strict";

  function announce(text) {
    var status = document.getElementById("gk-copy-status");
    if (status) status.textContent = text;
  }

  function selectAndCopy(field) {
    field.focus();
    field.select();
    var ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (e) {
      ok = false;
    }
    announce(ok ? "Copied." : "Selected: press Ctrl+C (or Command+C) to copy.");
  }

  function copy(field) {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(field.value).then(
        function () { announce("Copied."); },
        function () { selectAndCopy(field); }
      );
    } else {
      selectAndCopy(field);
    }
  }

  function init() {
    var buttons = document.querySelectorAll("button[data-copy]");
    Array.prototype.forEach.call(buttons, function (button) {
      var field = document.getElementById(button.getAttribute("data-copy"));
      if (!field) return;
      button.hidden = false;
      button.addEventListener("click", function () { copy(field); });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
