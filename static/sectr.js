// Sectr's page behaviour: the live socket with its resume cursor, the composer's keys,
// autoscroll. No build step; htmx (static/vendor/htmx.min.js) does the swapping.
//
// The chat socket (/ws/sessions/<id>/?after=N) sends JSON frames whose `html` is a set
// of htmx out-of-band swaps rendered from the same template partials as the page, and
// whose `seq` is the last journal seq they cover. The page keeps that seq as its cursor
// (#transcript[data-last-seq], first set by the server-rendered page) and sends it as
// `after` whenever it reconnects, so nothing is missed and nothing is shown twice. The
// htmx ws extension reconnects but has no such cursor, hence this small socket.
(function () {
  "use strict";

  function socketUrl(path, query) {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    return scheme + location.host + path + (query ? "?" + query : "");
  }

  function swapOob(html) {
    if (html) {
      htmx.swap(document.body, html, { swapStyle: "none" });
    }
  }

  function nearBottom() {
    const el = document.scrollingElement || document.documentElement;
    return el.scrollHeight - el.scrollTop - el.clientHeight < 120;
  }

  function scrollToBottom() {
    const el = document.scrollingElement || document.documentElement;
    el.scrollTop = el.scrollHeight;
  }

  function setLive(text, state) {
    const live = document.getElementById("live");
    if (live) {
      live.textContent = text;
      live.dataset.state = state;
    }
  }

  // A socket that reconnects with exponential backoff (0.5 s doubling to 15 s, with
  // jitter). `query()` gives the query string for each (re)connect; `onFrame` gets
  // each parsed frame; `onReconnect` runs when a later connection opens.
  function liveSocket(path, query, onFrame, onReconnect) {
    let attempts = 0;
    let failedBeforeOpen = 0;
    let everOpened = false;
    let socket = null;
    let timer = null;
    let stopped = false;

    function connect() {
      timer = null;
      if (stopped) return;
      let opened = false;
      socket = new WebSocket(socketUrl(path, query()));
      socket.onopen = function () {
        opened = true;
        failedBeforeOpen = 0;
        if (everOpened && onReconnect) onReconnect();
        everOpened = true;
      };
      socket.onmessage = function (event) {
        let frame;
        try {
          frame = JSON.parse(event.data);
        } catch (e) {
          return;
        }
        if (frame.ready) attempts = 0;
        onFrame(frame);
      };
      socket.onclose = function () {
        socket = null;
        if (stopped) return;
        if (!opened) failedBeforeOpen += 1;
        setLive("reconnecting…", "reconnecting");
        if (failedBeforeOpen >= 2) {
          // Refused twice before opening: find out whether we may still see this page
          // (logged out, or the session is gone) before hammering the server.
          fetch(location.href, { method: "GET", redirect: "manual", credentials: "same-origin" })
            .then(function (response) {
              if (response.type === "opaqueredirect" || response.status === 403 || response.status === 404) {
                stopped = true;
                setLive("disconnected: reload the page", "refused");
              } else {
                schedule();
              }
            })
            .catch(schedule);
        } else {
          schedule();
        }
      };
    }

    function schedule() {
      if (stopped || timer !== null || socket !== null) return;
      const delay = Math.min(15000, 500 * Math.pow(2, attempts)) * (0.5 + Math.random() / 2);
      attempts += 1;
      timer = setTimeout(connect, delay);
    }

    function reconnectNow() {
      if (stopped || socket !== null) return;
      if (timer !== null) clearTimeout(timer);
      attempts = 0;
      connect();
    }

    window.addEventListener("online", reconnectNow);
    document.addEventListener("visibilitychange", function () {
      if (document.visibilityState === "visible") reconnectNow();
    });
    connect();
    return {
      close: function () {
        stopped = true;
        if (socket) socket.close();
      },
    };
  }

  // ---- the chat page ----

  function startChat(chat) {
    const transcript = document.getElementById("transcript");
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
      if (follow) scrollToBottom();
    }

    window.sectrChat = liveSocket(
      chat.dataset.wsPath,
      function () {
        return "after=" + cursor;
      },
      onFrame,
      null,
    );
    scrollToBottom();
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
      if (box) box.focus();
      if (flash && !flash.querySelector(".flash-info")) flash.innerHTML = "";
    });
  }

  function start() {
    const chat = document.getElementById("chat");
    if (chat && chat.dataset.wsPath) startChat(chat);
    const composer = document.getElementById("composer");
    if (composer) startComposer(composer);
    // A new flash message replaces the previous one; clear it after a while.
    document.body.addEventListener("htmx:afterSwap", function (event) {
      const target = event.detail && event.detail.target;
      if (target && target.id === "flash") {
        const shown = target.innerHTML;
        setTimeout(function () {
          if (target.innerHTML === shown) target.innerHTML = "";
        }, 8000);
      }
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
