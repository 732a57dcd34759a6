// Sectr's page behaviour: the live socket with its resume cursor, the composer's keys,
// autoscroll, Copy buttons, Edit forms, relative and local times, expiry countdowns, the
// theme toggle, menus, the sessions sidebar, polite announcements, and refused htmx
// actions' messages in #flash. No build step and no inline script or event
// handler anywhere (the pages run under a strict CSP); htmx
// (static/vendor/htmx.min.js) does the swapping.
//
// The chat socket (/ws/sessions/<id>/?after=N) sends JSON frames whose `html` is a set
// of htmx out-of-band swaps rendered from the same template partials as the page, and
// whose `seq` is the last journal seq they cover. The page keeps that seq as its cursor
// (#transcript[data-last-seq], first set by the server-rendered page) and sends it as
// `after` whenever it reconnects, so nothing is missed and nothing is shown twice. The
// htmx ws extension reconnects but has no such cursor, hence our own socket
// (static/live-socket.js, shared with the approval queue).
(function () {
  "use strict";

  function swapOob(html) {
    if (html) {
      htmx.swap(document.body, html, { swapStyle: "none" });
    }
  }

  function nearBottom() {
    const el = document.scrollingElement || document.documentElement;
    return el.scrollHeight - el.scrollTop - el.clientHeight < 120;
  }

  // Scroll only as far as the conversation's end needs to show above the composer (on
  // opening a chat, and as a reply streams in): a conversation that fits stays at the
  // top, with the page's navigation (the document is a little taller than the window:
  // the sticky sidebar is a full window high under the top bar).
  function revealEnd(transcript) {
    const last = transcript.lastElementChild;
    if (!last) return;
    const composer = document.getElementById("composer");
    const limit = composer ? composer.getBoundingClientRect().top : window.innerHeight;
    const overflow = last.getBoundingClientRect().bottom - limit;
    if (overflow > 0) window.scrollBy(0, overflow + 16);
  }

  const liveSocket = window.sectrLive.liveSocket;
  const setLive = window.sectrLive.setLive;

  // ---- the chat page ----

  function startChat(chat) {
    const transcript = document.getElementById("transcript");
    // The page places itself (revealEnd), not the browser's memory of the last visit.
    if ("scrollRestoration" in history) history.scrollRestoration = "manual";
    let cursor = parseInt(transcript.dataset.lastSeq || "0", 10) || 0;

    function onFrame(frame) {
      if (frame.reload) {
        location.reload();
        return;
      }
      if (frame.ready) {
        setLive("live", "live");
        return;
      }
      if (typeof frame.seq !== "number" || frame.seq <= cursor) return; // seen already
      const follow = nearBottom();
      swapOob(frame.html);
      cursor = frame.seq;
      transcript.dataset.lastSeq = String(cursor);
      enhance(transcript);
      followTitle();
      announceNews(transcript);
      if (follow) revealEnd(transcript);
    }

    announceNews(transcript, true); // what the page came with is not news
    window.sectrChat = liveSocket(
      chat.dataset.wsPath,
      function () {
        return "after=" + cursor;
      },
      onFrame,
      null,
    );
    revealEnd(transcript);
  }

  function startComposer(form) {
    const box = form.querySelector("textarea");
    const files = form.querySelector("input[type=file]");
    function hasSomething() {
      return (box && box.value.trim() !== "") || (files && files.files.length > 0);
    }
    if (box) {
      box.addEventListener("keydown", function (event) {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
          event.preventDefault();
          if (hasSomething()) form.requestSubmit();
        }
      });
    }
    form.addEventListener("submit", function (event) {
      if (!hasSomething()) event.preventDefault();
    });
    // The server answers a sent message or steer with the "sectr:sent" event.
    document.body.addEventListener("sectr:sent", function () {
      if (box) box.value = "";
      if (files) files.value = "";
      const flash = document.getElementById("flash");
      // preventScroll: the composer is sticky at the bottom, and focusing it would scroll
      // the page to its place in the flow (hiding the navigation of a short chat).
      if (box) box.focus({ preventScroll: true });
      if (flash && !flash.querySelector(".flash-info")) flash.innerHTML = "";
    });
  }

  // ---- reading: Copy, Edit, times, the tab title, announcements ----

  function copyText(text, button) {
    function done() {
      button.classList.add("copied");
      announce("Copied to the clipboard.");
      setTimeout(function () {
        button.classList.remove("copied");
      }, 1500);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () {
        fallbackCopy(text) && done();
      });
    } else if (fallbackCopy(text)) {
      done();
    }
  }

  function fallbackCopy(text) {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.appendChild(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (e) {
      ok = false;
    }
    area.remove();
    return ok;
  }

  // Code blocks get their Copy button here (the Markdown is sanitised server-side and
  // carries no buttons); idempotent, so it runs after every swap.
  function enhance(root) {
    root.querySelectorAll(".md pre:not([data-copy-ready])").forEach(function (pre) {
      pre.dataset.copyReady = "1";
      if (!pre.hasAttribute("tabindex")) pre.tabIndex = 0; // scrollable: reachable by keyboard
      const wrap = document.createElement("div");
      wrap.className = "code-block";
      pre.parentNode.insertBefore(wrap, pre);
      wrap.appendChild(pre);
      const button = document.createElement("button");
      button.type = "button";
      button.className = "copy copy-code";
      button.textContent = "Copy";
      button.setAttribute("aria-label", "Copy");
      button.dataset.copyCode = "1";
      wrap.appendChild(button);
    });
    labelCells(root);
    // A region that scrolls sideways must be reachable by keyboard to be scrolled.
    root.querySelectorAll(".table-scroll:not([tabindex]), main table:not([tabindex]), main pre:not([tabindex])").forEach(function (region) {
      if (region.scrollWidth > region.clientWidth) region.tabIndex = 0;
    });
    updateTimes(root);
    updateDeadlines(root);
    localTimes(root);
  }

  // A table with column headers becomes one card per row on a phone (static/layout.css):
  // each cell gets its column's name as data-label, shown before it. A cell that spans
  // columns (an "empty" row) gets none; markdown tables in messages stay tables.
  function labelCells(root) {
    const tables = root.matches && root.matches("main table") ? [root] : root.querySelectorAll("main table");
    tables.forEach(function (table) {
      if (table.closest(".md") || table.dataset.noCards !== undefined) return;
      const heads = table.querySelectorAll(":scope > thead > tr > th");
      if (!heads.length) return;
      const names = Array.prototype.map.call(heads, function (th) {
        return th.textContent.trim();
      });
      table.querySelectorAll(":scope > tbody > tr, :scope > tfoot > tr").forEach(function (row) {
        Array.prototype.forEach.call(row.children, function (cell, index) {
          if (cell.hasAttribute("data-label")) return;
          cell.dataset.label = cell.colSpan > 1 ? "" : names[index] || "";
        });
      });
      table.classList.add("cards");
    });
  }

  const MINUTE = 60 * 1000;
  function relative(when) {
    const ms = Date.now() - when.getTime();
    if (ms < MINUTE) return "just now";
    if (ms < 60 * MINUTE) return Math.floor(ms / MINUTE) + " min ago";
    if (ms < 24 * 60 * MINUTE) return Math.floor(ms / (60 * MINUTE)) + " h ago";
    const days = Math.floor(ms / (24 * 60 * MINUTE));
    if (days < 7) return days + (days > 1 ? " days ago" : " day ago");
    return when.toISOString().slice(0, 10);
  }

  function updateTimes(root) {
    (root || document).querySelectorAll("time.ago[datetime]").forEach(function (node) {
      const when = new Date(node.getAttribute("datetime"));
      if (!isNaN(when.getTime())) {
        const text = relative(when);
        if (node.textContent !== text) node.textContent = text;
        if (!node.dataset.local) {
          node.dataset.local = "1";
          node.title = when.toLocaleString();
        }
      }
    });
  }

  // An ask's expiry counts down on both cards ("expires in 54 min"; the server writes the
  // same words: sessions_app.display.approvals.remaining_text).
  function remaining(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    if (seconds < 60) return seconds + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min";
    if (seconds < 86400) return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
    return Math.floor(seconds / 86400) + " d " + Math.floor((seconds % 86400) / 3600) + " h";
  }

  function updateDeadlines(root) {
    (root || document).querySelectorAll("time[data-expires][datetime]").forEach(function (node) {
      const at = Date.parse(node.getAttribute("datetime"));
      if (isNaN(at)) return;
      const left = (at - Date.now()) / 1000;
      const text = left > 0 ? "expires in " + remaining(left) : "expiring now";
      if (node.textContent !== text) node.textContent = text;
      if (!node.title) node.title = "Denied unless decided by " + new Date(at).toLocaleString();
    });
  }

  // Times shown in the reader's own time zone and words (the audit): the server writes
  // UTC, the browser rewrites it.
  function localTimes(root) {
    (root || document).querySelectorAll("time.local[datetime]:not([data-local])").forEach(function (node) {
      const when = new Date(node.getAttribute("datetime"));
      if (isNaN(when.getTime())) return;
      node.dataset.local = "1";
      node.title = node.textContent;
      node.textContent = when.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
    });
  }

  // The tab title and the session's entry in the sidebar follow the session's title (a
  // rename, or the first message becoming the title, arrives as an OOB swap of the h1).
  function followTitle() {
    const heading = document.getElementById("session-title");
    if (heading) {
      const text = heading.textContent.trim();
      const title = text + " · Sectr";
      if (document.title !== title) document.title = title;
      const entry = document.querySelector("#sidebar-list li.current .sidebar-title");
      if (entry && entry.textContent !== text) entry.textContent = text;
    }
  }

  function announce(text) {
    const region = document.getElementById("announce");
    if (!region) return;
    region.textContent = "";
    // A new text node after a tick, so screen readers notice the same words twice.
    setTimeout(function () {
      region.textContent = text;
    }, 50);
  }

  // Politely announce a finished assistant message and a new approval ask, once each.
  function announceNews(root, quiet) {
    const news = [];
    root.querySelectorAll("[data-role=assistant]:not(.streaming):not([data-announced])").forEach(function (node) {
      node.dataset.announced = "1";
      const text = (node.querySelector(".msg-text") || node).textContent.trim();
      if (text) news.push("Assistant: " + text.slice(0, 300));
    });
    root.querySelectorAll("[data-role=approval][data-status=pending]:not([data-announced])").forEach(function (node) {
      node.dataset.announced = "1";
      const name = node.querySelector("header code");
      news.push("Approval needed for " + (name ? name.textContent : "a tool") + ".");
    });
    if (!quiet && news.length) announce(news.join(" "));
  }

  function onClick(event) {
    const target = event.target instanceof Element ? event.target : null;
    if (!target) return;
    const copy = target.closest("button[data-copy], button[data-copy-code]");
    if (copy) {
      let source = null;
      if (copy.dataset.copyCode) {
        source = copy.parentNode.querySelector("pre");
      } else {
        source = document.getElementById(copy.dataset.copy);
      }
      const field = source instanceof HTMLInputElement || source instanceof HTMLTextAreaElement;
      if (source) copyText(field ? source.value : source.innerText.replace(/\n$/, ""), copy);
      return;
    }
    const edit = target.closest("button[data-edit]");
    if (edit) {
      const form = document.getElementById(edit.dataset.edit);
      if (form) {
        form.hidden = !form.hidden;
        edit.setAttribute("aria-expanded", String(!form.hidden));
        if (!form.hidden) {
          const box = form.querySelector("textarea");
          if (box) {
            box.focus();
            box.setSelectionRange(box.value.length, box.value.length);
          }
        }
      }
      return;
    }
    const cancel = target.closest("button[data-edit-cancel]");
    if (cancel) {
      const form = document.getElementById(cancel.dataset.editCancel);
      if (form) {
        form.hidden = true;
        const opener = document.querySelector('button[data-edit="' + form.id + '"]');
        if (opener) {
          opener.setAttribute("aria-expanded", "false");
          opener.focus();
        }
      }
      return;
    }
    if (target.closest("[data-theme-toggle]")) {
      setTheme(currentTheme() === "dark" ? "light" : "dark");
      return;
    }
    const navToggle = target.closest("[data-nav-toggle]");
    if (navToggle) {
      const open = document.body.classList.toggle("nav-open");
      navToggle.setAttribute("aria-expanded", String(open));
      return;
    }
    const sidebarToggle = target.closest("[data-sidebar-toggle]");
    if (sidebarToggle) {
      const collapsed = document.body.classList.toggle("sidebar-collapsed");
      sidebarToggle.setAttribute("aria-expanded", String(!collapsed));
      remember("sectr-sidebar", collapsed ? "collapsed" : "open");
      return;
    }
    // A click outside an open menu closes it.
    document.querySelectorAll("details[data-menu][open]").forEach(function (menu) {
      if (!menu.contains(target)) menu.open = false;
    });
  }

  function remember(key, value) {
    try {
      localStorage.setItem(key, value);
    } catch (e) {
      // Storage disabled: the choice lasts for this page only.
    }
  }

  function recall(key) {
    try {
      return localStorage.getItem(key);
    } catch (e) {
      return null;
    }
  }

  function currentTheme() {
    const chosen = document.documentElement.dataset.theme;
    if (chosen === "light" || chosen === "dark") return chosen;
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  function setTheme(theme) {
    document.documentElement.dataset.theme = theme;
    remember("sectr-theme", theme);
    showTheme();
  }

  function showTheme() {
    document.querySelectorAll("[data-theme-toggle]").forEach(function (button) {
      button.setAttribute("aria-pressed", String(currentTheme() === "dark"));
    });
  }

  function onKeydown(event) {
    if (event.key !== "Escape") return;
    document.querySelectorAll("details[data-menu][open]").forEach(function (menu) {
      menu.open = false;
      const summary = menu.querySelector("summary");
      if (summary) summary.focus();
    });
  }

  // ---- refusals: the server's message in #flash, never an error page in a card ----

  // The page's #flash (a live region at the top of <main> where a page has none of its
  // own), so a view's answer retargeted there (HX-Retarget: #flash) always lands.
  function flashArea() {
    let area = document.getElementById("flash");
    if (!area) {
      const main = document.getElementById("main");
      if (!main) return null;
      area = document.createElement("div");
      area.id = "flash";
      area.className = "flash-area";
      area.setAttribute("aria-live", "assertive");
      main.insertBefore(area, main.firstChild);
    }
    return area;
  }

  function showRefusal(text) {
    const area = flashArea();
    if (!area) return;
    const notice = document.createElement("div");
    notice.className = "flash flash-error";
    notice.setAttribute("role", "alert");
    notice.textContent = text;
    area.replaceChildren(notice);
    const shown = area.innerHTML;
    setTimeout(function () {
      if (area.innerHTML === shown) area.innerHTML = "";
    }, 12000);
  }

  // What an error answer says: a fragment's alert, else an error page's heading and
  // first paragraph, else its text; always short.
  function refusalText(xhr) {
    const fallback = "The server refused this (HTTP " + xhr.status + (xhr.statusText ? " " + xhr.statusText : "") + ").";
    const body = xhr.responseText || "";
    if (!body.trim()) return fallback;
    const doc = new DOMParser().parseFromString(body, "text/html");
    const alert = doc.querySelector("[role=alert], .flash");
    let text = "";
    if (alert) {
      text = alert.textContent;
    } else {
      const heading = doc.querySelector("main h1, h1");
      const para = doc.querySelector("main p, p");
      text = [heading && heading.textContent, para && para.textContent].filter(Boolean).join(": ");
      if (!text) text = doc.body ? doc.body.textContent : "";
    }
    text = text.replace(/\s+/g, " ").trim();
    if (!text) return fallback;
    return text.length > 300 ? text.slice(0, 299) + "…" : text;
  }

  function watchRefusals() {
    document.body.addEventListener("htmx:beforeRequest", function () {
      flashArea();
    });
    // A 4xx is swapped (base.html's htmx-config): the views send fragments for the card
    // or #flash. An answer that is a whole page (Django's 403 or 404 page, a proxy's) or
    // bare text is not put in the card: its message goes to #flash instead.
    document.body.addEventListener("htmx:beforeSwap", function (event) {
      const xhr = event.detail && event.detail.xhr;
      if (!xhr || xhr.status < 400 || xhr.status >= 500 || xhr.getResponseHeader("HX-Retarget")) return;
      const body = xhr.responseText || "";
      const fragment = /^\s*</.test(body) && !/<html[\s>]|<!doctype/i.test(body);
      if (fragment && event.detail.shouldSwap) return;
      event.detail.shouldSwap = false;
      showRefusal(refusalText(xhr));
    });
    // 5xx (not swapped) and no answer at all; the badge's poll just tries again.
    function polled(event) {
      const elt = event.detail && event.detail.elt;
      return Boolean(elt && elt.id === "approvals-badge");
    }
    document.body.addEventListener("htmx:responseError", function (event) {
      const xhr = event.detail && event.detail.xhr;
      if (xhr && xhr.status >= 500 && !polled(event)) {
        showRefusal("The server failed (HTTP " + xhr.status + "). Reload the page to see where things stand, then try again.");
      }
    });
    document.body.addEventListener("htmx:sendError", function (event) {
      if (!polled(event)) showRefusal("The server did not answer: check the connection and try again.");
    });
  }

  function start() {
    document.addEventListener("click", onClick);
    watchRefusals();
    // A form with data-confirm asks first (revoking a share link, say); Cancel sends nothing.
    document.addEventListener("submit", function (event) {
      const form = event.target instanceof HTMLFormElement ? event.target : null;
      if (form && form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
    });
    document.addEventListener("keydown", onKeydown);
    showTheme();
    if (recall("sectr-sidebar") === "collapsed") {
      document.body.classList.add("sidebar-collapsed");
      document.querySelectorAll("[data-sidebar-toggle]").forEach(function (button) {
        button.setAttribute("aria-expanded", "false");
      });
    }
    enhance(document);
    setInterval(function () {
      updateTimes(document);
    }, 30000);
    setInterval(function () {
      updateDeadlines(document);
    }, 1000);
    document.body.addEventListener("htmx:afterSettle", function (event) {
      if (event.target instanceof Element) enhance(event.target);
    });
    const chat = document.getElementById("chat");
    if (chat && chat.dataset.wsPath) startChat(chat);
    const composer = document.getElementById("composer");
    if (composer) startComposer(composer);
    // A new flash message replaces the previous one; it fades (static/sectr.css) and is
    // cleared after a while. A menu's flash closes nothing: it shows under the header.
    document.body.addEventListener("htmx:afterSwap", function (event) {
      const target = event.detail && event.detail.target;
      if (target && target.id === "flash") {
        const shown = target.innerHTML;
        setTimeout(function () {
          if (target.innerHTML === shown) target.innerHTML = "";
        }, 8000);
      }
    });
    // The `Approvals` badge of a moderator's page polls its count (templates/moderation/
    // _badge.html): not while the tab is hidden, and at once when it shows again.
    document.body.addEventListener("htmx:beforeRequest", function (event) {
      const elt = event.detail && event.detail.elt;
      if (elt && elt.id === "approvals-badge" && document.hidden) event.preventDefault();
    });
    document.addEventListener("visibilitychange", function () {
      const badge = document.getElementById("approvals-badge");
      if (!document.hidden && badge && badge.hasAttribute("hx-get")) htmx.trigger(badge, "refresh-badge");
    });
    // An approval card's `Edit arguments` field must hold a JSON object: the browser
    // (and htmx, which checks a form's validity first) refuses to send it otherwise; the
    // server checks it again against the tool's signature.
    document.addEventListener("input", function (event) {
      const field = event.target;
      if (!(field instanceof HTMLTextAreaElement) || !field.hasAttribute("data-json-object")) return;
      let problem = "";
      try {
        const value = JSON.parse(field.value);
        if (value === null || typeof value !== "object" || Array.isArray(value)) {
          problem = "The arguments must be a JSON object: { ... }";
        }
      } catch (error) {
        problem = "Not JSON: " + error.message;
      }
      field.setCustomValidity(problem);
    });
    // Page-level messages (after a redirect) fade too.
    document.querySelectorAll(".messages").forEach(function (list) {
      setTimeout(function () {
        list.remove();
      }, 10000);
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
