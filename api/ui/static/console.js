/* The record page: verify the record's evidence bundle in this browser (verify.js), against
   the log key the officer pinned (kept in localStorage), and show each step. */
(function () {
  "use strict";
  var PIN = "inference-ledger.pinned-log-key";
  var panel = document.getElementById("verify");
  if (!panel) return;
  var steps = document.getElementById("steps");
  var result = document.getElementById("verify-result");
  var pinState = document.getElementById("pin-state");
  var pinText = document.getElementById("pin-text");
  var pinError = document.getElementById("pin-error");
  var NAMES = {
    format: "Bundle format", jcs: "Leaf hash of the canonical record",
    collector_signature: "Collector's signature", request_id: "Request ID is the signed one",
    log_key_pin: "Log key is the pinned key", checkpoint_signature: "Checkpoint signed by the log key",
    inclusion_proof: "Inclusion proof", collector_key: "Collector key registration",
    fingerprint: "Fingerprint named by the record", fingerprint_signature: "Fingerprint signature",
    fingerprint_inclusion: "Fingerprint in the log", fingerprint_key: "Fingerprint signer registration",
    replays: "Replay verdicts", disclosures: "Disclosed content", erasure: "Erasure event"
  };

  async function pinned() {
    var text = window.localStorage.getItem(PIN);
    if (!text) return null;
    try {
      return await window.LedgerVerify.parsePinnedKey(text);
    } catch (e) {  // a stored key this verifier cannot read: say so, never pretend none is set
      return { error: e.message };
    }
  }

  function item(cls, text) {
    var li = document.createElement("li");
    li.className = cls;
    li.textContent = text;
    steps.appendChild(li);
    return li;
  }

  var runs = 0;  // a later run (a key pinned meanwhile) owns the list of steps

  async function run() {
    var mine = ++runs;
    steps.textContent = "";
    delete panel.dataset.state;
    result.textContent = "Verifying…";
    result.className = "result";
    var key = await pinned();
    if (key && key.error) {
      pinState.className = "warn-box";
      pinState.textContent = "The pinned log key cannot be read (" + key.error + "): pin it " +
        "again below. Until then the bundle is checked against the key it carries.";
      key = null;
    } else if (key) {
      pinState.className = "ok-box";
      pinState.textContent = "Pinned log key " + key.keyId + " (kept in this browser).";
    } else {
      pinState.className = "warn-box";
      pinState.textContent = "No log key is pinned: the bundle is checked against the key it " +
        "carries, which proves it is self-consistent, not that this ledger's log holds it. " +
        "Pin the log key below.";
    }
    var bundle;
    try {
      var resp = await fetch(panel.dataset.evidence, { credentials: "same-origin", cache: "no-store" });
      if (!resp.ok) throw new Error("the ledger answered " + resp.status);
      // The bytes, not resp.text(): text() would mend invalid UTF-8 and drop a BOM, where
      // verify.js decodes the bytes strictly, as `ledger verify` does with a downloaded file.
      bundle = new Uint8Array(await resp.arrayBuffer());
    } catch (e) {
      result.className = "result invalid";
      result.textContent = "Could not fetch the evidence bundle: " + e.message;
      return;
    }
    if (!window.crypto || !window.crypto.subtle) {
      result.className = "result invalid";
      result.textContent = "This browser offers no WebCrypto here: open the console over HTTPS " +
        "(or on localhost) to verify in the browser.";
      return;
    }
    var shown = function (s) {  // each step as it is settled
      if (mine !== runs) return;
      var label = (NAMES[s.check] || s.check) + " [" + s.check + "]";
      // passed, not_pinned (ok: the key it carries), skipped (a v1 bundle's fingerprint
      // checks), failed, not_run (after a failure)
      var cls = s.ok === true ? "pass" : (s.ok === false ? "fail" : "skip");
      var li = item(cls, label + (s.message ? ": " + s.message : ""));
      li.dataset.check = s.check;
      li.dataset.state = cls;
    };
    var t0 = performance.now();
    var out;
    try {
      out = await window.LedgerVerify.verifyBundle(bundle, key, shown);
    } catch (e) {  // no Ed25519 in this browser's WebCrypto, for one
      result.className = "result invalid";
      result.textContent = "This browser cannot verify the bundle: " + e.message;
      panel.dataset.state = "error";
      return;
    }
    var ms = performance.now() - t0;
    if (mine !== runs) return;
    if (out.valid) {
      result.className = "result valid";
      result.textContent = "VALID: every step passed in this browser (" + ms.toFixed(1) + " ms)" +
        (out.pinned ? "." : ", without a pinned log key.");
    } else {
      result.className = "result invalid";
      result.textContent = "INVALID: the check “" + (NAMES[out.failed] || out.failed) + "” [" +
        out.failed + "] failed.";
    }
    panel.dataset.ms = ms.toFixed(2);
    panel.dataset.state = out.valid ? "valid" : "invalid";
    panel.dataset.failed = out.failed || "";
  }

  document.getElementById("pin-save").addEventListener("click", async function () {
    pinError.hidden = true;
    try {
      await window.LedgerVerify.parsePinnedKey(pinText.value);
    } catch (e) {
      pinError.textContent = e.message;
      pinError.hidden = false;
      return;
    }
    window.localStorage.setItem(PIN, pinText.value.trim());
    run();
  });
  document.getElementById("pin-clear").addEventListener("click", function () {
    window.localStorage.removeItem(PIN);
    pinText.value = "";
    run();
  });
  run();
})();
