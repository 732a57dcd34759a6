// The approval queue (/approvals/): its live socket, live ages, the count badge and the
// keyboard (a: approve once, A: approve all of the card's turn, d: deny the focused card). No inline script: the page
// marks its parts with data- attributes and this file finds them.
//
// The socket (/ws/approvals/?team=&tool=&age=) sends JSON frames whose `html` holds
// htmx out-of-band swaps rendered from templates/moderation/_card.html: a new card is
// appended to #approval-queue, a changed or decided card replaces the one on the page.
// Decided, withdrawn and expired cards show who decided and how for a few seconds, then
// leave the queue. The socket is the chat's (static/live-socket.js, loaded by base.html):
// the same backoff and prompt reconnects. After a reconnect the queue is reloaded
// (decisions may have happened meanwhile: the channel layer is at-most-once, the page's
// GET reads the journal). The first connect names the moment the page was read
// (`since`, from data-as-of): when an ask was made or decided between that read and the
// socket's start, the socket says `stale` and the queue is reloaded the same way.
(function () {
  "use strict";

  const RESOLVED_LINGER_MS = 8000;

  const setLive = window.sectrLive.setLive;

  function pendingCards(queue) {
    return Array.prototype.slice.call(queue.querySelectorAll("article.queue-card[data-status=pending]"));
  }

  function updateBadge(page, queue) {
    // The badge counts every ask waiting for this user (not those waiting for others:
    // voted on already, or their own needing others' approvals); a filtered queue shows fewer.
    if (page.dataset.wsQuery) return;
    const badge = document.getElementById("approvals-badge");
    if (!badge) return;
    const count = queue.querySelectorAll("article.queue-card[data-status=pending][data-waits=you]").length;
    badge.textContent = String(count);
    badge.dataset.count = String(count);
    badge.hidden = count === 0;
  }

  function dropDuplicates(queue) {
    // A card the socket pushes as it comes of age may already be on the page (the GET
    // and the socket overlap): the one on the page stays.
    const seen = {};
    queue.querySelectorAll("article.queue-card").forEach(function (card) {
      if (seen[card.id]) card.remove();
      else seen[card.id] = true;
    });
  }

  function retireResolved(queue) {
    queue.querySelectorAll("article.queue-card:not([data-status=pending])").forEach(function (card) {
      if (card.dataset.leaving) return;
      card.dataset.leaving = "1";
      setTimeout(function () {
        if (card.isConnected && card.dataset.status !== "pending") card.remove();
      }, RESOLVED_LINGER_MS);
    });
  }

  function humanAge(seconds) {
    if (seconds < 60) return Math.max(0, Math.floor(seconds)) + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min";
    if (seconds < 86400) return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
    return Math.floor(seconds / 86400) + " d";
  }

  function refreshAges(root) {
    const now = Date.now();
    root.querySelectorAll("time[data-age]").forEach(function (el) {
      const at = Date.parse(el.getAttribute("datetime") || "");
      if (!isNaN(at)) el.textContent = humanAge((now - at) / 1000) + " ago";
    });
  }

  function reloadQueue(page) {
    const query = (page.dataset.wsQuery ? page.dataset.wsQuery + "&" : "") + "partial=queue";
    htmx.ajax("GET", location.pathname + "?" + query, { target: "#approval-queue", swap: "innerHTML" });
  }

  function connect(page) {
    // static/live-socket.js: the chat's socket, with its backoff, its prompt reconnect
    // when the tab shows again and its stop once the page is no longer ours to see.
    let since = page.dataset.asOf || "";
    return window.sectrLive.liveSocket(
      page.dataset.wsPath,
      function () {
        const query = page.dataset.wsQuery || "";
        if (!since) return query;
        const first = (query ? query + "&" : "") + "since=" + encodeURIComponent(since);
        since = ""; // later connects reload the queue anyway
        return first;
      },
      function (frame) {
        if (frame.ready) {
          setLive("live", "live");
          return;
        }
        if (frame.stale) {
          reloadQueue(page); // asked or decided between the page's read and this socket
          return;
        }
        if (frame.html) htmx.swap(document.body, frame.html, { swapStyle: "none" });
      },
      function () {
        // Back after a break: decisions made meanwhile never reached this page.
        reloadQueue(page);
      },
    );
  }

  function cardOf(element) {
    return element && element.closest ? element.closest("article.queue-card[data-status=pending]") : null;
  }

  function onKey(queue, event) {
    if (event.altKey || event.ctrlKey || event.metaKey || event.isComposing) return;
    const key = event.key.toLowerCase();
    if (key !== "a" && key !== "d") return;
    const target = event.target;
    if (target && (target.tagName === "TEXTAREA" || target.tagName === "INPUT" || target.tagName === "SELECT")) return;
    const card = cardOf(target);
    if (!card || !queue.contains(card)) return;
    const all = event.key === "A" ? card.querySelector("button[name=scope][value=turn]") : null;
    const button = all || card.querySelector(key === "a" ? "button[value=allow_once]" : "button[value=deny]");
    if (!button) return;
    event.preventDefault();
    // Focus moves on to the next card, so a run of asks can be decided from the keyboard.
    const cards = pendingCards(queue);
    const next = cards[cards.indexOf(card) + 1] || null;
    button.click();
    if (next) next.focus();
  }

  function start() {
    const page = document.getElementById("approval-queue-page");
    const queue = document.getElementById("approval-queue");
    if (!page || !queue || !page.dataset.wsPath) return;
    connect(page);
    document.addEventListener("keydown", function (event) {
      onKey(queue, event);
    });
    document.body.addEventListener("htmx:afterSettle", function () {
      retireResolved(queue);
      updateBadge(page, queue);
      refreshAges(queue);
    });
    new MutationObserver(function () {
      dropDuplicates(queue);
      retireResolved(queue);
      updateBadge(page, queue);
    }).observe(queue, { childList: true, subtree: true, attributes: true, attributeFilter: ["data-status"] });
    refreshAges(queue);
    setInterval(function () {
      refreshAges(queue);
    }, 5000);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
