// attnforge coverage page: everything here is an addition; the page is complete without it.
(function () {
  "use strict";
  // 1. install commands name the index as INDEX_URL: this page's own address is the index root
  var root = new URL(".", document.baseURI).href.replace(/\/$/, "");
  document.querySelectorAll("code.cmd").forEach(function (code) {
    var walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      walker.currentNode.nodeValue = walker.currentNode.nodeValue.split("INDEX_URL").join(root);
    }
  });
  var note = document.getElementById("index-url-note");
  if (note) {
    note.textContent = "The install commands are for this index, " + root + ".";
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
    var tools = code.dataset.cmd === "pip" && code.closest("td").querySelector(".tools");
    if (tools) {
      tools.insertBefore(button, tools.firstChild);  // beside "uv, file" and the manifest: no line of its own
    } else {
      code.parentNode.insertAdjacentElement("afterend", button);
    }
  });
  function select(node) {
    var range = document.createRange();
    range.selectNodeContents(node);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }

  // 3. search and state filter over grid rows and refusal groups; kept in the address (?q=&state=, or the
  //    same after #) so a link or a reload shows the same view
  var form = document.getElementById("filters");
  var text = document.getElementById("filter-text");
  var state = document.getElementById("filter-state");
  var status = document.getElementById("filter-status");
  var sections = Array.prototype.slice.call(document.querySelectorAll("#grids section.grid"));
  var items = [];
  sections.forEach(function (section) {
    var where = section.querySelector("h3").textContent;
    section.querySelectorAll("tbody tr").forEach(function (tr) {
      var words = [where, tr.querySelector("th").textContent];
      tr.querySelectorAll("td:not(.empty)").forEach(function (td) {
        words.push(td.dataset.py === "every" ? "every python abi3 stable" : "python " + td.dataset.py);
        td.querySelectorAll(".state, .span").forEach(function (s) { words.push(s.textContent); });
      });
      items.push({ node: tr, group: false, hay: words.join(" ").toLowerCase(),
                   states: (tr.dataset.states || "").split(" ") });
    });
    section.querySelectorAll("li.group").forEach(function (li) {
      items.push({ node: li, group: true, hay: (where + " " + li.textContent).toLowerCase(),
                   states: (li.dataset.states || "").split(" ") });
    });
  });
  function fromAddress() {
    var params = new URLSearchParams(location.search);
    if (!params.has("q") && !params.has("state") && location.hash.indexOf("=") !== -1) {
      params = new URLSearchParams(location.hash.slice(1));
    }
    text.value = params.get("q") || "";
    var wanted = params.get("state") || "";
    state.value = Array.prototype.some.call(state.options, function (o) { return o.value === wanted; }) ? wanted : "";
  }
  function toAddress() {
    var params = new URLSearchParams();
    if (text.value.trim()) { params.set("q", text.value.trim()); }
    if (state.value) { params.set("state", state.value); }
    var query = params.toString();
    var hash = location.hash.indexOf("=") !== -1 ? "" : location.hash;
    history.replaceState(null, "", location.pathname + (query ? "?" + query : "") + hash);
  }
  function apply() {
    var words = text.value.toLowerCase().split(/\s+/).filter(Boolean);
    var wanted = state.value;
    var active = words.length > 0 || Boolean(wanted);
    var rows = 0, rowsShown = 0, groups = 0, groupsShown = 0;
    items.forEach(function (item) {
      var ok = words.every(function (w) { return item.hay.indexOf(w) !== -1; }) &&
        (!wanted || item.states.indexOf(wanted) !== -1);
      item.node.hidden = !ok;
      if (item.group) { groups += 1; groupsShown += ok ? 1 : 0; } else { rows += 1; rowsShown += ok ? 1 : 0; }
      item.node.querySelectorAll(".entry").forEach(function (entry) {
        entry.classList.toggle("dim", Boolean(wanted) && !entry.classList.contains("state-" + wanted));
      });
    });
    sections.forEach(function (section) {
      section.hidden = !section.querySelector("tbody tr:not([hidden]), li.group:not([hidden])");
      var table = section.querySelector("table");
      if (table) { table.hidden = !section.querySelector("tbody tr:not([hidden])"); }
      var details = section.querySelector("details.refusals");
      if (details && (active || details.dataset.auto)) {
        details.open = active && Boolean(details.querySelector("li.group:not([hidden])"));
        details.dataset.auto = details.open ? "1" : "";
      }
    });
    status.textContent = "Showing " + rowsShown + " of " + rows + " rows and " + groupsShown + " of " +
      groups + " refusal groups";
  }
  fromAddress();
  text.addEventListener("input", function () { apply(); toAddress(); });
  state.addEventListener("change", function () { apply(); toAddress(); });
  window.addEventListener("popstate", function () { fromAddress(); apply(); });
  form.addEventListener("submit", function (event) { event.preventDefault(); });
  form.hidden = false;
  apply();
})();
