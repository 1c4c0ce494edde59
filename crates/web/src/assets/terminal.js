// The dashboard terminal (see terminal.rs): xterm.js on one side, the
// exec session's frames on a WebSocket on the other. A frame is a type
// byte, a big-endian u32 length and the payload: 1 data, 2 stderr,
// 3 resize (cols, rows as u16), 4 end of input, 5 exit (i32), 6 error
// (text), 7 ping.
(function () {
  'use strict';
  var el = document.getElementById('terminal');
  var status = document.getElementById('terminal-status');
  if (!el || !window.Terminal || !window.FitAddon) { return; }
  var term = new window.Terminal({ cursorBlink: true, scrollback: 5000 });
  var fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(el);
  fit.fit();
  window.cwTerminal = term;
  var encoder = new TextEncoder();
  var decoder = new TextDecoder();
  var ended = false;

  function frame(type, payload) {
    var out = new Uint8Array(5 + payload.length);
    out[0] = type;
    new DataView(out.buffer).setUint32(1, payload.length);
    out.set(payload, 5);
    return out;
  }

  var query = new URLSearchParams({ csrf: el.dataset.csrf, cols: String(term.cols), rows: String(term.rows) });
  if (el.dataset.instance) { query.set('instance', el.dataset.instance); }
  var scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  var ws = new WebSocket(scheme + '//' + location.host + el.dataset.url + '?' + query.toString());
  ws.binaryType = 'arraybuffer';
  var opened = false;

  ws.onopen = function () {
    opened = true;
    status.textContent = el.dataset.open;
    term.focus();
  };

  var pending = new Uint8Array(0);
  ws.onmessage = function (event) {
    var bytes = new Uint8Array(event.data);
    var joined = new Uint8Array(pending.length + bytes.length);
    joined.set(pending, 0);
    joined.set(bytes, pending.length);
    var at = 0;
    while (joined.length - at >= 5) {
      var view = new DataView(joined.buffer, joined.byteOffset + at);
      var type = joined[at];
      var length = view.getUint32(1);
      if (joined.length - at - 5 < length) { break; }
      var payload = joined.subarray(at + 5, at + 5 + length);
      at += 5 + length;
      if (type === 1 || type === 2) {
        term.write(payload.slice());
      } else if (type === 5) {
        ended = true;
        var code = new DataView(payload.buffer, payload.byteOffset).getInt32(0);
        status.textContent = el.dataset.exited + ' ' + code;
        status.dataset.exit = String(code);
      } else if (type === 6) {
        ended = true;
        status.textContent = decoder.decode(payload);
        status.dataset.error = '1';
      }
    }
    pending = joined.slice(at);
  };

  ws.onclose = function () {
    if (!ended) {
      status.textContent = opened ? el.dataset.closed : el.dataset.refused;
      status.dataset.closed = '1';
    }
  };

  term.onData(function (data) {
    if (ws.readyState === 1) { ws.send(frame(1, encoder.encode(data))); }
  });
  term.onResize(function (size) {
    if (ws.readyState !== 1) { return; }
    var payload = new Uint8Array(4);
    var view = new DataView(payload.buffer);
    view.setUint16(0, size.cols);
    view.setUint16(2, size.rows);
    ws.send(frame(3, payload));
  });
  window.addEventListener('resize', function () { fit.fit(); });
})();
