// The live socket both pages use (the chat in static/sectr.js, the approval queue in
// static/moderation.js): one WebSocket that reconnects with exponential backoff (0.5 s
// doubling to 15 s, with jitter), at once when the tab shows again or the network comes
// back, and that stops when it was refused twice before opening and the page itself is
// no longer ours to see (logged out, access lost, the session gone). A plain script, no
// build step: it sets `window.sectrLive` for the page scripts loaded after it.
//
//   sectrLive.liveSocket(path, query, onFrame, onReconnect)
//     `query()` gives the query string for each (re)connect (the chat's resume cursor);
//     `onFrame` gets each parsed JSON frame; `onReconnect` runs when a later connection
//     opens (the queue reloads itself: frames sent while it was away are lost).
//   sectrLive.setLive(text, state)  the page's #live status ("live", "reconnecting"...).
(function () {
  "use strict";

  function socketUrl(path, query) {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    return scheme + location.host + path + (query ? "?" + query : "");
  }

  function setLive(text, state) {
    const live = document.getElementById("live");
    if (live) {
      live.textContent = text;
      live.dataset.state = state;
    }
  }

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

  window.sectrLive = { liveSocket: liveSocket, setLive: setLive };
})();
