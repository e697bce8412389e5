// attnforge coverage page: everything here is an addition; the page is complete without it.
(function () {
  "use strict";
  // 1. install commands name the index as INDEX_URL: this page's own address is the index root
  var root = new URL(".", document.baseURI).href.replace(/\/$/, "");
  document.querySelectorAll("code.cmd").forEach(function (code) {
    code.textContent = code.textContent.split("INDEX_URL").join(root);
  });
  var note = document.getElementById("index-url-note");
  if (note) {
    note.textContent = "The install commands below are for this index, " + root + ".";
  }

  // 2. copy buttons
  document.querySelectorAll("code.cmd").forEach(function (code) {
    var button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy the " + code.dataset.cmd + " command for " + code.dataset.what);
    button.addEventListener("click", function () {
      var done = function () { button.textContent = "Copied"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(code.textContent).then(done, function () { select(code); });
      } else {
        select(code);
      }
    });
    code.parentNode.insertAdjacentElement("afterend", button);
  });
  function select(node) {
    var range = document.createRange();
    range.selectNodeContents(node);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }

  // 3. search and state filter: rows whose text has every word, and an entry in the chosen state
  var form = document.getElementById("filters");
  var text = document.getElementById("filter-text");
  var state = document.getElementById("filter-state");
  var status = document.getElementById("filter-status");
  var rows = Array.prototype.slice.call(document.querySelectorAll("#grids tbody tr"));
  var sections = Array.prototype.slice.call(document.querySelectorAll("#grids section.grid"));
  function apply() {
    var words = text.value.toLowerCase().split(/\s+/).filter(Boolean);
    var wanted = state.value;
    var shown = 0;
    rows.forEach(function (tr) {
      var hay = tr.dataset.search || "";
      var states = (tr.dataset.states || "").split(" ");
      var ok = words.every(function (w) { return hay.indexOf(w) !== -1; }) &&
        (!wanted || states.indexOf(wanted) !== -1);
      tr.hidden = !ok;
      if (ok) { shown += 1; }
      tr.querySelectorAll(".entry").forEach(function (entry) {
        entry.classList.toggle("dim", Boolean(wanted) && entry.dataset.state !== wanted);
      });
    });
    sections.forEach(function (section) {
      section.hidden = !section.querySelector("tbody tr:not([hidden])");
    });
    status.textContent = "Showing " + shown + " of " + rows.length + " rows";
  }
  text.addEventListener("input", apply);
  state.addEventListener("change", apply);
  form.addEventListener("submit", function (event) { event.preventDefault(); });
  form.hidden = false;
  apply();
})();
