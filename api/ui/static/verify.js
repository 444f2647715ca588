/*
 * verify.js: the offline evidence-bundle verifier (ledger/evidence.py) in the browser.
 *
 * A plain script, no modules, no build step, no dependencies: it defines
 *
 *   window.LedgerVerify = {verifyBundle, parsePinnedKey, canonicalize, CHECKS, ...}
 *
 * verifyBundle runs exactly the checks of ledger.evidence.verify_bundle, in the same order and
 * under the same names (CHECKS), and stops at the first that fails, as the Python verifier
 * does. Hashes and signatures are WebCrypto's (SHA-256, Ed25519), so the page must be served
 * from a secure context (https:, or http://127.0.0.1 / localhost).
 *
 * Give verifyBundle the bundle's JSON *text* (a string, or the file's bytes): it is then read
 * exactly as `ledger verify` reads the file (ledger.evidence_format.load_bundle: a member named
 * twice is refused, 1 and 1.0 stay apart, integers keep every digit). An object already parsed
 * with JSON.parse is accepted too, but it has lost what JSON.parse drops: it cannot tell 1.0
 * from 1 (read as 1), and an integral number beyond 2**53 fails the format check loudly rather
 * than being guessed at.
 *
 * Step messages and summary values quote what the bundle holds (names, reasons, IDs): a page
 * renders them as text (textContent), never as HTML.
 *
 * Each member is checked as the Python modules check it: ledger/evidence_format.py (format),
 * ledger/canonical.py (RFC 8785), ledger/signing.py (envelopes, key IDs, roles),
 * ledger/checkpoint.py (C2SP signed note), ledger/merkle.py (RFC 9162 inclusion),
 * ledger/fingerprint_facts.py, ledger/records.py, ledger/record_v2.py, ledger/disclosures.py,
 * ledger/evidence_content.py (disclosures, erasure).
 */
(function (global) {
  "use strict";

  // --- constants (as the Python modules define them) -------------------------------------

  const CHECKS = Object.freeze([
    "format",
    "jcs",
    "collector_signature",
    "request_id",
    "log_key_pin",
    "checkpoint_signature",
    "inclusion_proof",
    "collector_key",
    "fingerprint",
    "fingerprint_signature",
    "fingerprint_inclusion",
    "fingerprint_key",
    "replays",
    "disclosures",
    "erasure",
  ]);
  const FINGERPRINT_CHECKS = Object.freeze([
    "fingerprint",
    "fingerprint_signature",
    "fingerprint_inclusion",
    "fingerprint_key",
  ]);
  const FORMAT = "inference-ledger/evidence/v3";
  const FORMAT_V2 = "inference-ledger/evidence/v2";
  const FORMAT_V1 = "inference-ledger/evidence/v1";
  const FORMATS = [FORMAT, FORMAT_V2, FORMAT_V1];
  const RECORD_KIND = "inference_record";
  const FINGERPRINT_KIND = "fingerprint";
  const REGISTRATION_KIND = "key_registration";
  const ERASURE_KIND = "erasure";
  const VERDICT_KIND = "replay_verdict";
  const ALG = "ed25519";
  const KEY_ID_PREFIX = "ed25519:";
  const SIGNATURE_SIZE = 64;
  const SIGNABLE_KINDS = new Map([
    ["collector", ["fingerprint", "inference_record", "replay_output", "worker_heartbeat"]],
    ["replayer", ["replay_verdict"]],
    ["log", ["replay_verdict", "pool_certificate", "erasure", "legal_hold", "hold_release"]],
  ]);
  const MAX_SAFE = Number.MAX_SAFE_INTEGER;
  const MAX_SAFE_BIG = BigInt(MAX_SAFE);
  const MAX_DEPTH = 900; // json.loads meets Python's recursion limit near 1000 levels
  const PY_INT_MAX_DIGITS = 4300; // int(str) refuses longer literals (sys.int_info)

  // --- errors -----------------------------------------------------------------------------

  /** A failed check of the bundle: ledger.evidence_format.fail(check, message, code). */
  class CheckFailure extends Error {
    constructor(check, message, code) {
      super(message);
      this.check = check;
      this.code = code || "bad_evidence";
    }
  }

  /** InvalidInput / VerificationError of the inner modules (before a check names them). */
  class LedgerError extends Error {
    constructor(message, code, check) {
      super(message);
      this.code = code || "invalid_input";
      this.check = check; // ledger.disclosures' sub-check (encoding, digest, unique)
    }
  }

  const fail = (check, message, code) => new CheckFailure(check, message, code);
  const invalid = (message, code) => new LedgerError(message, code || "schema_violation");

  // --- JSON values as Python reads them ---------------------------------------------------
  //
  // Python's json tells an int from a float; JavaScript's numbers do not. Values here are:
  // strings, booleans, null, arrays, objects (null prototype), and numbers where
  //   - a JS number that is a safe integer is a Python int (-0 is read as 0);
  //   - a BigInt is a Python int beyond 2**53 (canonicalize refuses it, as Python does);
  //   - a JS number that is not an integer (or is infinite) is a Python float;
  //   - a PyFloat wraps a Python float of integral value (1.0, -0.0, 1e21).

  class PyFloat {
    constructor(value) {
      this.value = value;
      Object.freeze(this);
    }
  }

  const hasOwn = Object.prototype.hasOwnProperty;
  const has = (obj, key) => hasOwn.call(obj, key);
  /** dict.get(key): None (null) when absent. */
  const get = (obj, key) => (has(obj, key) ? obj[key] : null);
  const isStr = (v) => typeof v === "string";
  const isInt = (v) => (typeof v === "number" && Number.isInteger(v)) || typeof v === "bigint";
  const isList = Array.isArray;
  const isDict = (v) =>
    v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof PyFloat);
  const TYPES = { str: isStr, int: isInt, dict: isDict, list: isList };
  const TYPE_NAMES = { str: "string", int: "integer", dict: "object", list: "array" };

  function numeric(v) {
    if (typeof v === "boolean") return v ? 1 : 0;
    if (typeof v === "number" || typeof v === "bigint") return v;
    if (v instanceof PyFloat) return v.value;
    return undefined;
  }

  /** Python's ==: True == 1 == 1.0, deep for lists and dicts, nothing else across types. */
  function pyEq(a, b) {
    if (a === b) return true;
    const na = numeric(a);
    const nb = numeric(b);
    if (na !== undefined && nb !== undefined) return na == nb; // eslint-disable-line eqeqeq
    if (isList(a) && isList(b)) {
      if (a.length !== b.length) return false;
      for (let i = 0; i < a.length; i++) if (!pyEq(a[i], b[i])) return false;
      return true;
    }
    if (isDict(a) && isDict(b)) {
      const ka = Object.keys(a);
      if (ka.length !== Object.keys(b).length) return false;
      for (const k of ka) if (!has(b, k) || !pyEq(a[k], b[k])) return false;
      return true;
    }
    return false;
  }

  const pyIn = (value, options) => options.some((o) => pyEq(value, o));

  /** repr-like text of a value for messages (never for anything compared). */
  function show(v) {
    if (v === null || v === undefined) return "None";
    if (typeof v === "bigint") return v.toString();
    if (v instanceof PyFloat) return String(v.value);
    try {
      const s = JSON.stringify(v);
      return s === undefined ? String(v) : s.length > 80 ? s.slice(0, 77) + "..." : s;
    } catch (e) {
      return String(v);
    }
  }

  // --- JSON text parsing ------------------------------------------------------------------

  /**
   * Parse JSON text into the values above.
   *
   * mode "python": json.loads as load_bundle calls it (a member named twice and NaN/Infinity
   * refused; an integer literal is an int of any size, up to 4300 digits; a float literal that
   * overflows is infinity). mode "orjson": orjson.loads (an integer literal beyond 64 bits is
   * a float; a float that overflows is refused), as ledger.disclosures reads a disclosure.
   */
  function parseJson(text, mode) {
    const orjson = mode === "orjson";
    const n = text.length;
    let i = 0;

    const error = (message) => {
      throw new LedgerError(`${message}: char ${i}`, "not_json");
    };
    const isDigit = (c) => c >= 0x30 && c <= 0x39;
    const ws = () => {
      while (i < n) {
        const c = text.charCodeAt(i);
        if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
        else break;
      }
    };
    const constant = (name) => {
      if (orjson) error(`${name} is not JSON`);
      throw fail("format", `${name} is not JSON`);
    };

    function makeInt(lit) {
      const digits = lit.charCodeAt(0) === 0x2d ? lit.length - 1 : lit.length;
      if (!orjson && digits > PY_INT_MAX_DIGITS) {
        error(`an integer literal of ${digits} digits exceeds Python's limit`);
      }
      if (digits <= 15) {
        const v = +lit;
        return v === 0 ? 0 : v;
      }
      const big = BigInt(lit);
      if (big >= -MAX_SAFE_BIG && big <= MAX_SAFE_BIG) return Number(big);
      if (orjson && (big < -(2n ** 63n) || big > 2n ** 64n - 1n)) return new PyFloat(Number(lit));
      return big;
    }

    function makeFloat(lit) {
      const v = Number(lit);
      if (!Number.isFinite(v)) {
        if (orjson) error("number is infinity when parsed as double");
        return v; // json.loads: float('1e400') is inf
      }
      return Number.isInteger(v) ? new PyFloat(v) : v;
    }

    function number() {
      const start = i;
      if (text.charCodeAt(i) === 0x2d) i++;
      const c = text.charCodeAt(i);
      if (c === 0x30) i++;
      else if (c >= 0x31 && c <= 0x39) {
        i++;
        while (isDigit(text.charCodeAt(i))) i++;
      } else error("Expecting value");
      let float = false;
      if (text.charCodeAt(i) === 0x2e && isDigit(text.charCodeAt(i + 1))) {
        float = true;
        i += 2;
        while (isDigit(text.charCodeAt(i))) i++;
      }
      const e = text.charCodeAt(i);
      if (e === 0x65 || e === 0x45) {
        let j = i + 1;
        const s = text.charCodeAt(j);
        if (s === 0x2b || s === 0x2d) j++;
        if (isDigit(text.charCodeAt(j))) {
          float = true;
          i = j + 1;
          while (isDigit(text.charCodeAt(i))) i++;
        }
      }
      const lit = text.slice(start, i);
      return float ? makeFloat(lit) : makeInt(lit);
    }

    function string() {
      i++; // the opening quote
      let out = "";
      let start = i;
      for (;;) {
        if (i >= n) error("Unterminated string");
        const c = text.charCodeAt(i);
        if (c === 0x22) {
          out += text.slice(start, i);
          i++;
          return out;
        }
        if (c === 0x5c) {
          out += text.slice(start, i);
          const e = text.charCodeAt(i + 1);
          i += 2;
          switch (e) {
            case 0x22: out += '"'; break;
            case 0x5c: out += "\\"; break;
            case 0x2f: out += "/"; break;
            case 0x62: out += "\b"; break;
            case 0x66: out += "\f"; break;
            case 0x6e: out += "\n"; break;
            case 0x72: out += "\r"; break;
            case 0x74: out += "\t"; break;
            case 0x75: {
              const hex = text.slice(i, i + 4);
              if (!/^[0-9a-fA-F]{4}$/.test(hex)) error("Invalid \\uXXXX escape");
              out += String.fromCharCode(parseInt(hex, 16));
              i += 4;
              break;
            }
            default:
              i -= 1;
              error("Invalid \\escape");
          }
          start = i;
          continue;
        }
        if (c < 0x20) error("Invalid control character");
        i++;
      }
    }

    function value(depth) {
      if (depth > MAX_DEPTH) error("nested too deeply");
      ws();
      if (i >= n) error("Expecting value");
      const c = text.charCodeAt(i);
      if (c === 0x7b) {
        i++;
        const obj = Object.create(null);
        ws();
        if (text.charCodeAt(i) === 0x7d) {
          i++;
          return obj;
        }
        for (;;) {
          ws();
          if (text.charCodeAt(i) !== 0x22) error("Expecting property name enclosed in double quotes");
          const key = string();
          ws();
          if (text.charCodeAt(i) !== 0x3a) error("Expecting ':' delimiter");
          i++;
          const v = value(depth + 1);
          if (key in obj) {
            if (orjson) error("a member named twice");
            throw fail("format", `an object of the bundle names a member twice: ${show([key])}`);
          }
          obj[key] = v;
          ws();
          const d = text.charCodeAt(i);
          i++;
          if (d === 0x2c) continue;
          if (d === 0x7d) return obj;
          i--;
          error("Expecting ',' delimiter");
        }
      }
      if (c === 0x5b) {
        i++;
        const arr = [];
        ws();
        if (text.charCodeAt(i) === 0x5d) {
          i++;
          return arr;
        }
        for (;;) {
          arr.push(value(depth + 1));
          ws();
          const d = text.charCodeAt(i);
          i++;
          if (d === 0x2c) continue;
          if (d === 0x5d) return arr;
          i--;
          error("Expecting ',' delimiter");
        }
      }
      if (c === 0x22) return string();
      if (text.startsWith("true", i)) {
        i += 4;
        return true;
      }
      if (text.startsWith("false", i)) {
        i += 5;
        return false;
      }
      if (text.startsWith("null", i)) {
        i += 4;
        return null;
      }
      if (text.startsWith("NaN", i)) constant("NaN");
      if (text.startsWith("Infinity", i)) constant("Infinity");
      if (text.startsWith("-Infinity", i)) constant("-Infinity");
      if (c === 0x2d || isDigit(c)) return number();
      error("Expecting value");
    }

    const result = value(0);
    ws();
    if (i !== n) error("Extra data");
    return result;
  }

  /** A bundle given as an object: converted to the values above, refusing the ambiguous. */
  function fromObject(v, depth) {
    if (depth > MAX_DEPTH) throw fail("format", "the bundle is nested too deeply");
    switch (typeof v) {
      case "string":
      case "boolean":
      case "bigint":
        return v;
      case "number":
        if (!Number.isFinite(v)) throw fail("format", `${v} is not JSON`);
        if (Number.isInteger(v)) {
          if (!Number.isSafeInteger(v)) {
            throw fail(
              "format",
              `the bundle holds the integral number ${v}, beyond 2**53: a parsed object cannot ` +
                "say whether it was an integer or a float; give verifyBundle the bundle's JSON text"
            );
          }
          return v === 0 ? 0 : v;
        }
        return v;
      case "object": {
        if (v === null || v instanceof PyFloat) return v;
        if (Array.isArray(v)) return v.map((x) => fromObject(x, depth + 1));
        const proto = Object.getPrototypeOf(v);
        if (proto !== null && proto !== Object.prototype) {
          throw fail("format", "the bundle holds a value that is not JSON");
        }
        const out = Object.create(null);
        for (const k of Object.keys(v)) out[k] = fromObject(v[k], depth + 1);
        return out;
      }
      default:
        throw fail("format", `the bundle holds a ${typeof v}, which is not JSON`);
    }
  }

  const UTF8 = new TextEncoder();
  const UTF8_STRICT = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

  /** The bundle's bytes as ledger verify reads a file (load_bundle): strict UTF-8, one
   * leading BOM skipped; any other encoding is not a bundle. */
  function decodeBundleBytes(bytes) {
    const skip = bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf ? 3 : 0;
    try {
      return UTF8_STRICT.decode(bytes.subarray(skip));
    } catch (e) {
      throw fail("format", "the bytes are not UTF-8 text");
    }
  }

  /** What verifyBundle was given, as Python's values (the format check's first step). */
  function readBundle(input) {
    if (typeof input === "string" || input instanceof ArrayBuffer || ArrayBuffer.isView(input)) {
      let text;
      if (typeof input === "string") text = input.charCodeAt(0) === 0xfeff ? input.slice(1) : input;
      else if (input instanceof ArrayBuffer) text = decodeBundleBytes(new Uint8Array(input));
      else {
        text = decodeBundleBytes(new Uint8Array(input.buffer, input.byteOffset, input.byteLength));
      }
      try {
        return parseJson(text, "python");
      } catch (e) {
        if (e instanceof LedgerError) throw fail("format", `not JSON: ${e.message}`);
        throw e;
      }
    }
    return fromObject(input, 0);
  }

  // --- RFC 8785 (ledger/canonical.py) -----------------------------------------------------

  const isWellFormed = String.prototype.isWellFormed
    ? (s) => s.isWellFormed()
    : (s) => !/[\ud800-\udbff](?![\udc00-\udfff])|(?:^|[^\ud800-\udbff])[\udc00-\udfff]/.test(s);

  function quote(s) {
    if (!isWellFormed(s)) {
      throw new LedgerError(
        "value cannot be canonicalized (RFC 8785): a string holds a lone surrogate",
        "not_canonicalizable"
      );
    }
    return JSON.stringify(s); // RFC 8785's escapes are ECMAScript's
  }

  function numberText(v, isFloat) {
    if (!Number.isFinite(v)) {
      throw new LedgerError(
        `value cannot be canonicalized (RFC 8785): ${v} is not a JSON number`,
        "not_canonicalizable"
      );
    }
    // Below 1e21 RFC 8785 writes an integral number as its digits, which read back as an
    // integer: beyond 2**53 Python refuses it, int or float, so the text reads back the same.
    if (Number.isInteger(v) && !Number.isSafeInteger(v) && (!isFloat || Math.abs(v) < 1e21)) {
      throw new LedgerError(
        `value cannot be canonicalized (RFC 8785): the integral number ${v} is beyond 2**53 ` +
          (isFloat
            ? "(RFC 8785 writes it as integer digits, an integer Python refuses)"
            : "(Python refuses such an integer and writes such a float; which one it was is lost)"),
        "not_canonicalizable"
      );
    }
    return String(v); // Number::toString, RFC 8785 section 3.2.2.3 (-0 is "0")
  }

  function canon(v, depth) {
    switch (typeof v) {
      case "string":
        return quote(v);
      case "boolean":
        return v ? "true" : "false";
      case "number":
        return numberText(v, false);
      case "bigint":
        throw new LedgerError(
          `value cannot be canonicalized (RFC 8785): integer ${v} is outside the IEEE-754 safe range`,
          "not_canonicalizable"
        );
      case "object": {
        if (v === null) return "null";
        if (depth > MAX_DEPTH) throw new LedgerError("value is nested too deeply", "not_canonicalizable");
        if (Array.isArray(v)) {
          let s = "[";
          for (let k = 0; k < v.length; k++) {
            if (k) s += ",";
            s += canon(v[k], depth + 1);
          }
          return s + "]";
        }
        if (v instanceof PyFloat) return numberText(v.value, true);
        const proto = Object.getPrototypeOf(v);
        if (proto !== null && proto !== Object.prototype) break;
        const keys = Object.keys(v).sort(); // UTF-16 code unit order, as RFC 8785 sorts
        let s = "{";
        for (let k = 0; k < keys.length; k++) {
          if (k) s += ",";
          s += quote(keys[k]) + ":" + canon(v[keys[k]], depth + 1);
        }
        return s + "}";
      }
      default:
        break;
    }
    throw new LedgerError(
      `value cannot be canonicalized (RFC 8785): ${typeof v} is not a JSON value`,
      "not_canonicalizable"
    );
  }

  /**
   * RFC 8785 canonical JSON text of a value (UTF-8 it with TextEncoder for the bytes).
   * Throws, as ledger.canonical.canonicalize raises, for what has no canonical form: NaN,
   * infinities, lone surrogates, integers beyond 2**53 and integral floats from 2**53 to
   * 1e21 (written as integer digits); and for an integral JS number beyond 2**53, which
   * JSON.parse made of either an integer or a float: that is ambiguous, so it fails loudly
   * instead of guessing.
   */
  function canonicalize(value) {
    return canon(value, 0);
  }

  /** ledger.fingerprint_facts.shown: strings as they are, None as null, others as JSON. */
  const shown = (v) => (v === null || v === undefined || isStr(v) ? (v === undefined ? null : v) : canon(v, 0));

  // --- bytes, base64, SHA-256 -------------------------------------------------------------

  const B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const B64_VALUE = new Int8Array(128).fill(-1);
  for (let k = 0; k < 64; k++) B64_VALUE[B64_ALPHABET.charCodeAt(k)] = k;

  /** binascii.a2b_base64(text, strict_mode=True) of CPython 3.11 (also base64.b64decode(...,
   * validate=True)): throws Error with binascii's message. */
  function a2b(text) {
    if (typeof text !== "string") throw new TypeError("argument should be a string");
    const n = text.length;
    for (let k = 0; k < n; k++) {
      if (text.charCodeAt(k) > 0x7f) throw new Error("string argument should contain only ASCII characters");
    }
    if (n > 0 && text.charCodeAt(0) === 0x3d) throw new Error("Leading padding not allowed");
    const out = new Uint8Array(((n + 3) >> 2) * 3);
    let o = 0;
    let quad = 0;
    let left = 0;
    let pads = 0;
    let padding = false;
    for (let k = 0; k < n; k++) {
      const ch = text.charCodeAt(k);
      if (ch === 0x3d) {
        padding = true;
        if (quad >= 2 && quad + ++pads >= 4) {
          if (k + 1 < n) throw new Error("Excess data after padding");
          return out.slice(0, o);
        }
        continue;
      }
      const v = B64_VALUE[ch];
      if (v < 0) throw new Error("Only base64 data is allowed");
      if (padding) throw new Error("Discontinuous padding not allowed");
      pads = 0;
      switch (quad) {
        case 0:
          quad = 1;
          left = v;
          break;
        case 1:
          quad = 2;
          out[o++] = (left << 2) | (v >> 4);
          left = v & 0x0f;
          break;
        case 2:
          quad = 3;
          out[o++] = ((left << 4) | (v >> 2)) & 0xff;
          left = v & 0x03;
          break;
        default:
          quad = 0;
          out[o++] = ((left << 6) | v) & 0xff;
          left = 0;
      }
    }
    if (quad === 1) {
      throw new Error(
        "Invalid base64-encoded string: number of data characters " +
          `(${Math.floor(o / 3) * 4 + 1}) cannot be 1 more than a multiple of 4`
      );
    }
    if (quad !== 0) throw new Error("Incorrect padding");
    return out.slice(0, o);
  }

  /** ledger.disclosures._unb64url: strict base64url without padding. */
  function unb64url(text) {
    if (/[+/=]/.test(text) || text.length % 4 === 1) throw new Error("not base64url without padding");
    const std = text.replace(/-/g, "+").replace(/_/g, "/");
    return a2b(std + "=".repeat((4 - (text.length % 4)) % 4));
  }

  function b64encode(bytes) {
    let s = "";
    for (let k = 0; k < bytes.length; k++) s += String.fromCharCode(bytes[k]);
    return btoa(s);
  }

  const HEX = Array.from({ length: 256 }, (_, k) => k.toString(16).padStart(2, "0"));
  const hex = (bytes) => {
    let s = "";
    for (let k = 0; k < bytes.length; k++) s += HEX[bytes[k]];
    return s;
  };

  function bytesEqual(a, b) {
    if (a.length !== b.length) return false;
    for (let k = 0; k < a.length; k++) if (a[k] !== b[k]) return false;
    return true;
  }

  function concat(...parts) {
    let size = 0;
    for (const p of parts) size += p.length;
    const out = new Uint8Array(size);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  function subtle() {
    const s = global.crypto && global.crypto.subtle;
    if (!s) {
      throw new Error(
        "WebCrypto (crypto.subtle) is unavailable: the page must be served from a secure " +
          "context (https:, or http://127.0.0.1 / localhost)"
      );
    }
    return s;
  }

  async function sha256(bytes) {
    return new Uint8Array(await subtle().digest("SHA-256", bytes));
  }

  const LEAF_PREFIX = Uint8Array.of(0);
  const NODE_PREFIX = 1;

  async function nodeHash(left, right) {
    const buf = new Uint8Array(65);
    buf[0] = NODE_PREFIX;
    buf.set(left, 1);
    buf.set(right, 33);
    return sha256(buf);
  }

  // --- Ed25519 keys (ledger/signing.py) ---------------------------------------------------

  const P = (1n << 255n) - 19n;
  const modP = (a) => {
    const r = a % P;
    return r < 0n ? r + P : r;
  };
  function powP(base, exp) {
    let r = 1n;
    let b = modP(base);
    let e = exp;
    while (e > 0n) {
      if (e & 1n) r = (r * b) % P;
      b = (b * b) % P;
      e >>= 1n;
    }
    return r;
  }
  const CURVE_D = modP(-121665n * powP(121666n, P - 2n));
  const SQRT_M1 = powP(2n, (P - 1n) / 4n);

  function pointAdd(a, b) {
    const [x1, y1, z1, t1] = a;
    const [x2, y2, z2, t2] = b;
    const aa = modP((y1 - x1) * (y2 - x2));
    const bb = modP((y1 + x1) * (y2 + x2));
    const cc = modP(2n * t1 * t2 * CURVE_D);
    const dd = modP(2n * z1 * z2);
    const e = bb - aa;
    const f = dd - cc;
    const g = dd + cc;
    const h = bb + aa;
    return [modP(e * f), modP(g * h), modP(f * g), modP(e * h)];
  }

  const checkedKeys = new Set();

  /** The point a 32-byte encoding names: {x, y, sign, yBits}, or null for none. */
  function decodePoint(raw) {
    let n = 0n;
    for (let k = 31; k >= 0; k--) n = (n << 8n) | BigInt(raw[k]);
    const sign = n >> 255n;
    const yBits = n & ((1n << 255n) - 1n);
    const y = yBits % P;
    const u = modP(y * y - 1n);
    const v = modP(CURVE_D * y * y + 1n);
    let x = modP(modP(u * powP(v, 3n)) * powP(modP(u * powP(v, 7n)), (P - 5n) / 8n));
    if (modP(v * x * x - u) !== 0n) x = modP(x * SQRT_M1);
    if (modP(v * x * x - u) !== 0n) return null;
    return { x, y, sign, yBits };
  }

  /** Whether a point is one of the 8 torsion points (8 times it is the identity). */
  function isSmallOrder({ x, y }) {
    let point = [x, y, 1n, modP(x * y)];
    for (let k = 0; k < 3; k++) point = pointAdd(point, point);
    return point[0] === 0n && point[1] === point[2];
  }

  /** ledger.signing.check_public_key: refuse what is not a canonical, large-order point. */
  function checkPublicKey(raw) {
    if (raw.length !== 32) throw invalid(`an Ed25519 key is 32 bytes, not ${raw.length}`, "invalid_public_key");
    const id = hex(raw);
    if (checkedKeys.has(id)) return;
    const decoded = decodePoint(raw);
    if (decoded === null) throw invalid("the public key is not a point on Ed25519", "invalid_public_key");
    const { x, sign, yBits } = decoded;
    if (isSmallOrder(decoded)) {
      throw invalid(
        "the public key is a small-order Ed25519 point (all-zero or another of the 8 torsion " +
          "points): it binds no signer",
        "weak_public_key"
      );
    }
    if (yBits >= P || (x === 0n && sign)) {
      throw invalid("the public key is a non-canonical encoding of its point", "invalid_public_key");
    }
    checkedKeys.add(id);
  }

  /** ledger.signing.key_id_of: "ed25519:" + hex SHA-256 of the raw key. */
  async function keyIdOf(raw) {
    return KEY_ID_PREFIX + hex(await sha256(raw));
  }

  const SPKI_ED25519 = Uint8Array.of(0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00);

  function pemRaw(text) {
    const m = /^-----BEGIN ([A-Z0-9 ]+)-----\r?\n([A-Za-z0-9+/=\r\n\t ]*)-----END \1-----$/.exec(text);
    if (!m) throw invalid("not an Ed25519 public key: malformed PEM", "invalid_public_key");
    if (m[1] !== "PUBLIC KEY") throw invalid("public key is not Ed25519", "invalid_public_key");
    let der;
    try {
      der = a2b(m[2].replace(/[\r\n\t ]/g, ""));
    } catch (e) {
      throw invalid(`not an Ed25519 public key: ${e.message}`, "invalid_public_key");
    }
    if (der.length !== 44 || !bytesEqual(der.subarray(0, 12), SPKI_ED25519)) {
      throw invalid("public key is not Ed25519", "invalid_public_key");
    }
    return der.slice(12);
  }

  const loadedKeys = new Map();

  /** ledger.signing.load_public_key (PEM, or "ed25519:<base64 raw>", or the bare base64), as
   * a VerifyingKey {raw, keyId}; throws LedgerError. */
  async function loadPublicKey(text) {
    if (!isStr(text)) throw invalid("not an Ed25519 public key", "invalid_public_key");
    const cached = loadedKeys.get(text);
    if (cached) return cached;
    if (!isWellFormed(text)) throw invalid("not an Ed25519 public key: not UTF-8 text", "invalid_public_key");
    const stripped = text.replace(/^[ \t\n\r\v\f]+|[ \t\n\r\v\f]+$/g, "");
    let raw;
    if (stripped.startsWith("-----BEGIN")) raw = pemRaw(stripped);
    else {
      const body = stripped.startsWith(KEY_ID_PREFIX) ? stripped.slice(KEY_ID_PREFIX.length) : stripped;
      try {
        raw = a2b(body);
      } catch (e) {
        throw invalid(`not an Ed25519 public key: ${e.message}`, "invalid_public_key");
      }
      if (raw.length !== 32) {
        throw invalid("not an Ed25519 public key: An Ed25519 public key is 32 bytes long", "invalid_public_key");
      }
    }
    checkPublicKey(raw);
    const key = Object.freeze({ raw, keyId: await keyIdOf(raw) });
    if (loadedKeys.size > 256) loadedKeys.clear();
    loadedKeys.set(text, key);
    return key;
  }

  const importedKeys = new Map();

  function importKey(raw) {
    const id = hex(raw);
    let key = importedKeys.get(id);
    if (!key) {
      key = subtle().importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]);
      key.catch(() => importedKeys.delete(id));
      if (importedKeys.size > 256) importedKeys.clear();
      importedKeys.set(id, key);
    }
    return key;
  }

  // RFC 8032, section 7.1, test 1: the empty message signed under this key.
  const RFC8032_KEY = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
  const RFC8032_SIG =
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";
  const fromHex = (text) => Uint8Array.from(text.match(/../g), (h) => parseInt(h, 16));
  let ed25519Ready = null;

  /** Once per page: this WebCrypto verifies Ed25519 (else a signature check would fail as if
   * the bundle were forged; instead verifyBundle rejects, saying why). */
  function ensureEd25519() {
    if (!ed25519Ready) {
      ed25519Ready = (async () => {
        let ok = false;
        try {
          const key = await subtle().importKey("raw", fromHex(RFC8032_KEY), { name: "Ed25519" }, false, ["verify"]);
          ok = await subtle().verify({ name: "Ed25519" }, key, fromHex(RFC8032_SIG), new Uint8Array(0));
        } catch (e) {
          ok = false;
        }
        if (!ok) {
          ed25519Ready = null;
          throw new Error("this browser's WebCrypto does not verify Ed25519 signatures: it cannot check evidence bundles");
        }
      })();
    }
    return ed25519Ready;
  }

  /** ledger.signing.verify_signature: throws LedgerError unless it verifies. */
  async function verifySignature(raw, signature, message) {
    if (signature.length !== SIGNATURE_SIZE) {
      throw new LedgerError(`a signature is ${SIGNATURE_SIZE} bytes, not ${signature.length}`, "bad_signature");
    }
    // libsodium (ledger verify) refuses a signature whose R is a small-order point; WebCrypto
    // takes one (R the identity, S = h·a verifies): refused here as there
    const r = decodePoint(signature.subarray(0, 32));
    if (r !== null && isSmallOrder(r)) {
      throw new LedgerError("the signature does not verify", "bad_signature");
    }
    let ok = false;
    try {
      ok = await subtle().verify({ name: "Ed25519" }, await importKey(raw), signature, message);
    } catch (e) {
      ok = false;
    }
    if (!ok) throw new LedgerError("the signature does not verify", "bad_signature");
  }

  // --- envelopes (ledger/signing.py Envelope) ---------------------------------------------

  const BODY_PREFIX = UTF8.encode('{"body":');

  class Envelope {
    constructor(kind, body, keyId, sig) {
      this.kind = kind;
      this.body = body;
      this.keyId = keyId;
      this.sig = sig;
      this.bodyText = canon(body, 0);
      const tail =
        ',"kind":' + quote(kind) + ',"signature":{"alg":"ed25519","key_id":' + quote(keyId) +
        ',"sig":' + quote(sig) + "}}";
      // JCS(envelope) is assembled around JCS(body), as ledger.signing does
      this.canonicalText = '{"body":' + this.bodyText + tail;
      const bodyBytes = UTF8.encode(this.bodyText);
      const tailBytes = UTF8.encode(tail);
      // 0x00 || JCS(envelope): the leaf hash's input, with views of its parts
      const leafInput = new Uint8Array(1 + BODY_PREFIX.length + bodyBytes.length + tailBytes.length);
      leafInput.set(BODY_PREFIX, 1);
      leafInput.set(bodyBytes, 1 + BODY_PREFIX.length);
      leafInput.set(tailBytes, 1 + BODY_PREFIX.length + bodyBytes.length);
      this.leafInput = leafInput;
      this.bodyBytes = leafInput.subarray(1 + BODY_PREFIX.length, 1 + BODY_PREFIX.length + bodyBytes.length);
      this._digest = null;
      this._leaf = null;
    }

    /** "sha256:" digest of the canonical body (Envelope.body_digest). */
    bodyDigest() {
      if (!this._digest) this._digest = sha256(this.bodyBytes).then((h) => "sha256:" + hex(h));
      return this._digest;
    }

    /** SHA-256(0x00 || JCS(envelope)): merkle.leaf_hash(envelope.canonical). */
    leafHash() {
      if (!this._leaf) this._leaf = sha256(this.leafInput);
      return this._leaf;
    }
  }

  /** Envelope.from_dict: throws LedgerError naming the problem. */
  function envelopeFrom(data) {
    if (!isDict(data)) throw invalid("envelope must be a JSON object");
    const extra = Object.keys(data).filter((k) => k !== "kind" && k !== "body" && k !== "signature");
    if (extra.length) throw invalid(`envelope has unknown members: ${show(extra.sort())}`);
    const kind = get(data, "kind");
    const body = get(data, "body");
    const sig = get(data, "signature");
    if (!isStr(kind) || !kind) throw invalid("envelope.kind must be a non-empty string");
    if (!isDict(body)) throw invalid("envelope.body must be a JSON object");
    const sigKeys = isDict(sig) ? Object.keys(sig) : [];
    if (!isDict(sig) || sigKeys.length !== 3 || !["alg", "key_id", "sig"].every((k) => has(sig, k))) {
      throw invalid('envelope.signature must be {"alg", "key_id", "sig"}');
    }
    if (!pyEq(sig.alg, ALG)) {
      throw invalid(`unsupported signature algorithm ${show(sig.alg)}; only '${ALG}'`, "unsupported_algorithm");
    }
    if (!isStr(sig.key_id) || !isStr(sig.sig)) throw invalid("signature key_id and sig must be strings");
    return new Envelope(kind, body, sig.key_id, sig.sig);
  }

  /** ledger.signing.verify_envelope. */
  async function verifyEnvelope(env, key) {
    if (key.keyId !== env.keyId) {
      throw new LedgerError("signature key_id does not match the verifying key", "key_mismatch");
    }
    let sig;
    try {
      sig = a2b(env.sig);
    } catch (e) {
      throw new LedgerError("signature is not valid base64", "bad_signature");
    }
    try {
      await verifySignature(key.raw, sig, env.bodyBytes);
    } catch (e) {
      throw new LedgerError(`signature does not verify under key ${env.keyId}`, "bad_signature");
    }
  }

  // --- RFC 9162 inclusion (ledger/merkle.py) ----------------------------------------------

  /** merkle.verify_inclusion; index and treeSize are ints (numbers or BigInts). */
  async function verifyInclusion(leaf, index, treeSize, proof, root) {
    if (!(0 <= index && index < treeSize)) {
      throw new LedgerError(`leaf index ${index} is outside a tree of size ${treeSize}`, "bad_inclusion_proof");
    }
    for (const h of [leaf, root, ...proof]) {
      if (!(h instanceof Uint8Array) || h.length !== 32) {
        throw new LedgerError("every hash must be 32 bytes (SHA-256)", "bad_inclusion_proof");
      }
    }
    let fn = BigInt(index);
    let sn = BigInt(treeSize) - 1n;
    let r = leaf;
    for (const p of proof) {
      if (sn === 0n) throw new LedgerError("inclusion proof is too long", "bad_inclusion_proof");
      if (fn & 1n || fn === sn) {
        r = await nodeHash(p, r);
        if (!(fn & 1n)) {
          while (!(fn & 1n) && fn !== 0n) {
            fn >>= 1n;
            sn >>= 1n;
          }
        }
      } else {
        r = await nodeHash(r, p);
      }
      fn >>= 1n;
      sn >>= 1n;
    }
    if (sn !== 0n) throw new LedgerError("inclusion proof is too short", "bad_inclusion_proof");
    if (!bytesEqual(r, root)) throw new LedgerError("inclusion proof does not lead to the root hash", "bad_inclusion_proof");
  }

  // --- C2SP checkpoints (ledger/checkpoint.py) --------------------------------------------

  const SIG_PREFIX = "\u2014 ";
  const TIMESTAMP_PREFIX = "Timestamp: ";
  const DECIMAL = /^(?:0|[1-9][0-9]*)$/;
  const badCheckpoint = (message) => new LedgerError(message, "bad_checkpoint");

  async function noteKeyHash(name, raw) {
    const data = concat(UTF8.encode(name + "\n"), Uint8Array.of(1), raw);
    return (await sha256(data)).slice(0, 4);
  }

  /** checkpoint.verifier_key: "<name>+<hex key hash>+<base64(0x01 || key)>". */
  async function verifierKey(name, raw) {
    return `${name}+${hex(await noteKeyHash(name, raw))}+${b64encode(concat(Uint8Array.of(1), raw))}`;
  }

  const toInt = (big) => (big <= MAX_SAFE_BIG ? Number(big) : big);

  /** checkpoint.parse_checkpoint. */
  function parseCheckpoint(note) {
    const cut = note.indexOf("\n\n");
    if (cut < 0 || !note.endsWith("\n")) throw badCheckpoint("checkpoint note has no signature block");
    const body = note.slice(0, cut);
    const sigs = note.slice(cut + 2);
    const lines = body.split("\n");
    if (lines.length < 3) throw badCheckpoint("checkpoint body must have origin, tree size and root hash lines");
    const [origin, sizeText, rootText] = lines;
    if (!DECIMAL.test(sizeText) || sizeText.length > 19) {
      throw badCheckpoint(`checkpoint tree size ${show(sizeText)} is not a decimal number`);
    }
    let root;
    try {
      root = a2b(rootText);
    } catch (e) {
      throw badCheckpoint("checkpoint root hash is not base64");
    }
    if (root.length !== 32) throw badCheckpoint("checkpoint root hash is not 32 bytes");
    let signedAtNs = null;
    const extensions = [];
    for (const line of lines.slice(3)) {
      if (!line) throw badCheckpoint("checkpoint extension lines must be non-empty");
      if (line.startsWith(TIMESTAMP_PREFIX)) {
        if (signedAtNs !== null) throw badCheckpoint("checkpoint carries two timestamp lines");
        const text = line.slice(TIMESTAMP_PREFIX.length);
        if (!DECIMAL.test(text) || text.length > 19) {
          throw badCheckpoint(`checkpoint timestamp ${show(text.slice(0, 40))} is not a decimal number of nanoseconds`);
        }
        signedAtNs = BigInt(text);
      } else extensions.push(line);
    }
    const signatures = [];
    for (const line of sigs.replace(/\n+$/, "").split("\n")) {
      if (!line.startsWith(SIG_PREFIX)) throw badCheckpoint(`malformed signature line ${show(line.slice(0, 40))}`);
      const rest = line.slice(SIG_PREFIX.length);
      const space = rest.lastIndexOf(" ");
      const name = space < 0 ? "" : rest.slice(0, space);
      let raw;
      try {
        raw = a2b(space < 0 ? rest : rest.slice(space + 1));
      } catch (e) {
        throw badCheckpoint("signature line is not base64");
      }
      signatures.push([name, raw]);
    }
    const cp = { origin, treeSize: toInt(BigInt(sizeText)), rootHash: root, signedAtNs, extensions };
    return { cp, signatures, signedText: body + "\n" };
  }

  /** checkpoint.verify_checkpoint under the log key (key name: the origin). */
  async function verifyCheckpoint(note, raw) {
    const { cp, signatures, signedText } = parseCheckpoint(note);
    const name = cp.origin;
    if (!isWellFormed(note)) throw badCheckpoint("the checkpoint note is not UTF-8 text");
    const want = await noteKeyHash(name, raw);
    for (const [sigName, blob] of signatures) {
      if (sigName !== name || !bytesEqual(blob.subarray(0, 4), want)) continue;
      try {
        await verifySignature(raw, blob.subarray(4), UTF8.encode(signedText));
      } catch (e) {
        throw new LedgerError("checkpoint signature does not verify under the log key", "bad_checkpoint_signature");
      }
      return cp;
    }
    throw new LedgerError(`checkpoint carries no signature by the log key '${name}'`, "bad_checkpoint_signature");
  }

  /** The checkpoint's signed time as the ledger writes times (RFC 3339, UTC, Z, microseconds). */
  function isoFromNs(ns) {
    const micros = ns / 1000n;
    const date = new Date(Number(micros / 1000n));
    const frac = Number(micros % 1000000n);
    const p2 = (v) => String(v).padStart(2, "0");
    const base =
      `${String(date.getUTCFullYear()).padStart(4, "0")}-${p2(date.getUTCMonth() + 1)}-` +
      `${p2(date.getUTCDate())}T${p2(date.getUTCHours())}:${p2(date.getUTCMinutes())}:` +
      p2(date.getUTCSeconds());
    return `${base}.${String(frac).padStart(6, "0")}Z`; // as the ledger writes times (RFC 3339)
  }

  // --- record bodies (ledger/records.py, ledger/record_v2.py) -----------------------------

  const REQUEST_ID = /^(?!\.{1,2}$)[A-Za-z0-9._:\-]{1,200}$/;
  const FINGERPRINT_ID = /^sha256:[0-9a-f]{64}$/;
  const NAME = /^[A-Za-z0-9._\-]{1,100}$/;
  const INT_STRING = /^(0|[1-9][0-9]{0,19})$/;
  const ENDPOINTS = ["/v1/completions", "/v1/chat/completions"];
  const MAX_TOP_K = 64;
  const REQUIRED_V1 = [
    "schema_version", "request_id", "fingerprint_id", "worker_id", "pool", "tier", "endpoint",
    "model", "request", "prompt_token_ids", "choices", "usage", "timings", "system_fingerprint",
  ];
  const OPTIONAL_V1 = ["request_raw", "aborted"];
  const CHOICE_REQUIRED = ["index", "token_ids", "finish_reason", "stop_reason"];
  const CHOICE_OPTIONAL = ["logprobs", "top_logprobs", "text"];
  const SAMPLING = [
    "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens",
    "min_tokens", "stop", "stop_token_ids", "n", "best_of", "logprobs", "top_logprobs",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos",
  ];
  const CHOICE_CLEAR = ["index", "finish_reason", "stop_reason"];
  const DIGESTS = "disclosure_digests";
  const CLEAR = [
    "schema_version", "request_id", "fingerprint_id", "worker_id", "pool", "tier", "endpoint",
    "model", "sampling", "choices", "usage", "timings", "system_fingerprint", DIGESTS,
  ];
  const OPTIONAL_CLEAR = ["aborted"];

  const sorted = (items) => show([...items].sort());
  const codePoints = (s) => {
    let count = 0;
    for (const _ of s) count++; // eslint-disable-line no-unused-vars
    return count;
  };

  function checkInt(value, field, lo, hi) {
    if (!isInt(value)) throw invalid(`${field} must be an integer`);
    if (value < lo || (hi !== undefined && value > hi)) {
      const range = hi !== undefined ? `${lo}..${hi}` : `>= ${lo}`;
      throw invalid(`${field} must be in ${range}, got ${value}`);
    }
    return value;
  }

  function checkStr(value, field, pattern) {
    if (!isStr(value) || !value) throw invalid(`${field} must be a non-empty string`);
    if (pattern && !pattern.test(value)) throw invalid(`${field} ${show(value.slice(0, 80))} does not match ${pattern.source}`);
    return value;
  }

  function checkVersion(body, versions) {
    const version = get(body, "schema_version");
    if (!(typeof version === "number" && versions.includes(version))) {
      throw invalid(
        `unsupported record schema_version ${show(version)}; this ledger reads ${versions.join(" and ")}`,
        "unsupported_schema_version"
      );
    }
    return version;
  }

  /** packing.decode_packed: the raw bytes of a packed array. */
  function decodePacked(value, field) {
    if (!isStr(value)) throw invalid(`${field}: expected a base64 string`);
    let raw;
    try {
      raw = a2b(value);
    } catch (e) {
      throw invalid(`${field}: not valid base64 (${e.message})`, "invalid_packing");
    }
    if (raw.length % 4) {
      throw invalid(`${field}: ${raw.length} bytes is not a whole number of 4-byte elements`, "invalid_packing");
    }
    return raw;
  }

  function checkTokenIds(raw, field) {
    for (let k = 3; k < raw.length; k += 4) {
      if (raw[k] & 0x80) throw invalid(`${field}: negative token ID at position ${(k - 3) / 4}`, "invalid_token_ids");
    }
    return raw.length / 4;
  }

  function checkLogprobs(raw, field) {
    for (let k = 3; k < raw.length; k += 4) {
      if ((raw[k] & 0x7f) === 0x7f && raw[k - 1] & 0x80) {
        throw invalid(`${field}: NaN or infinity at position ${(k - 3) / 4}`, "invalid_logprobs");
      }
    }
    return raw.length / 4;
  }

  function checkChoice(choice, i) {
    const where = `choices[${i}]`;
    if (!isDict(choice)) throw invalid(`${where} must be an object`);
    const missing = CHOICE_REQUIRED.filter((k) => !has(choice, k));
    if (missing.length) throw invalid(`${where} is missing ${sorted(missing)}`);
    const extra = Object.keys(choice).filter((k) => !CHOICE_REQUIRED.includes(k) && !CHOICE_OPTIONAL.includes(k));
    if (extra.length) throw invalid(`${where} has unknown members ${sorted(extra)}`);
    checkInt(choice.index, `${where}.index`, 0, 10000);
    const n = checkTokenIds(decodePacked(choice.token_ids, `${where}.token_ids`), `${where}.token_ids`);
    if (has(choice, "logprobs") && choice.logprobs !== null) {
      const m = checkLogprobs(decodePacked(choice.logprobs, `${where}.logprobs`), `${where}.logprobs`);
      if (m !== n) throw invalid(`${where}: ${m} logprobs for ${n} output tokens`, "length_mismatch");
    }
    const top = get(choice, "top_logprobs");
    if (top !== null) {
      const keys = isDict(top) ? Object.keys(top) : [];
      if (!isDict(top) || keys.length !== 3 || !["k", "token_ids", "logprobs"].every((k) => has(top, k))) {
        throw invalid(`${where}.top_logprobs must be {"k", "token_ids", "logprobs"}`);
      }
      const k = checkInt(top.k, `${where}.top_logprobs.k`, 1, MAX_TOP_K);
      const tid = checkTokenIds(decodePacked(top.token_ids, `${where}.top_logprobs.token_ids`), `${where}.top_logprobs.token_ids`);
      const tlp = checkLogprobs(decodePacked(top.logprobs, `${where}.top_logprobs.logprobs`), `${where}.top_logprobs.logprobs`);
      if (tid !== n * k || tlp !== n * k) {
        throw invalid(
          `${where}.top_logprobs: expected ${n} tokens x k=${k} = ${n * k} entries, got ${tid} IDs and ${tlp} logprobs`,
          "length_mismatch"
        );
      }
    }
    if (choice.finish_reason !== null && !isStr(choice.finish_reason)) throw invalid(`${where}.finish_reason must be a string or null`);
    const stop = choice.stop_reason;
    if (stop !== null && !isStr(stop) && !isInt(stop)) throw invalid(`${where}.stop_reason must be a string, an integer or null`);
    if (has(choice, "text") && !isStr(choice.text)) throw invalid(`${where}.text must be a string`);
    return n;
  }

  function checkCommon(body) {
    checkStr(body.request_id, "request_id", REQUEST_ID);
    checkStr(body.fingerprint_id, "fingerprint_id", FINGERPRINT_ID);
    checkStr(body.worker_id, "worker_id", NAME);
    checkStr(body.pool, "pool", NAME);
    checkInt(body.tier, "tier", 0, 2);
    if (!pyIn(body.endpoint, ENDPOINTS)) throw invalid(`endpoint must be one of ${show(ENDPOINTS)}, got ${show(body.endpoint)}`);
    const model = checkStr(body.model, "model");
    if (codePoints(model) > 300) throw invalid("model name longer than 300 characters");
    if (has(body, "aborted") && typeof body.aborted !== "boolean") throw invalid("aborted must be a boolean");
    if (!isList(body.choices) || !body.choices.length) throw invalid("choices must be a non-empty list");
    const usage = body.usage;
    if (!isDict(usage)) throw invalid("usage must be an object");
    for (const key of ["prompt_tokens", "completion_tokens", "total_tokens"]) {
      if (has(usage, key)) checkInt(usage[key], `usage.${key}`, 0);
    }
    const timings = body.timings;
    if (!isDict(timings)) throw invalid("timings must be an object");
    if (has(timings, "started_at")) parseTime(timings.started_at, "timings.started_at");
    for (const key of ["ttft_ns", "total_ns"]) {
      if (has(timings, key) && !(isStr(timings[key]) && INT_STRING.test(timings[key]))) {
        throw invalid(`timings.${key} must be a decimal integer string (nanoseconds)`);
      }
    }
    const sf = body.system_fingerprint;
    if (sf !== null && !isStr(sf)) throw invalid("system_fingerprint must be a string or null");
  }

  function checkContent(view) {
    if (!isDict(get(view, "request"))) throw invalid("request must be the JSON object sent to the engine");
    if (has(view, "request_raw")) {
      try {
        if (!isStr(view.request_raw)) throw new Error("not a string");
        a2b(view.request_raw);
      } catch (e) {
        throw invalid(`request_raw must be a base64 string (${e.message})`);
      }
    }
    checkTokenIds(decodePacked(view.prompt_token_ids, "prompt_token_ids"), "prompt_token_ids");
    const choices = view.choices;
    choices.forEach((c, i) => checkChoice(c, i));
    const indexes = choices.map((c) => c.index);
    if (new Set(indexes).size !== indexes.length) throw invalid("choices have duplicate index values");
  }

  function validateRecordV1(body) {
    checkVersion(body, [1]);
    const missing = REQUIRED_V1.filter((k) => !has(body, k));
    if (missing.length) throw invalid(`record is missing ${sorted(missing)}`);
    const extra = Object.keys(body).filter((k) => !REQUIRED_V1.includes(k) && !OPTIONAL_V1.includes(k));
    if (extra.length) throw invalid(`record has unknown members ${sorted(extra)}`);
    checkCommon(body);
    checkContent(body);
  }

  const DIGEST = /^sha256:[0-9a-f]{64}$/;

  function checkDigests(digests) {
    if (!isList(digests) || !digests.every((d) => isStr(d) && DIGEST.test(d))) {
      throw invalid(`${DIGESTS} must be a list of sha256:<64 hex> digests`);
    }
    for (let k = 1; k < digests.length; k++) {
      if (digests[k - 1] >= digests[k]) throw invalid(`${DIGESTS} must be sorted and unique`);
    }
    return digests;
  }

  function checkClear(body) {
    const missing = CLEAR.filter((k) => !has(body, k));
    if (missing.length) throw invalid(`record is missing ${sorted(missing)}`);
    const extra = Object.keys(body).filter((k) => !CLEAR.includes(k) && !OPTIONAL_CLEAR.includes(k));
    if (extra.length) throw invalid(`record has unknown members ${sorted(extra)}`);
    const sampling = body.sampling;
    if (!isDict(sampling) || Object.keys(sampling).some((k) => !SAMPLING.includes(k))) {
      throw invalid(`sampling must be an object of ${show(SAMPLING)}`);
    }
    const choices = body.choices;
    if (!isList(choices) || !choices.length) throw invalid("choices must be a non-empty list");
    choices.forEach((c, i) => {
      const keys = isDict(c) ? Object.keys(c) : [];
      if (!isDict(c) || keys.length !== 3 || !CHOICE_CLEAR.every((k) => has(c, k))) {
        throw invalid(`choices[${i}] must hold exactly ${show(CHOICE_CLEAR)}`);
      }
      if (!(typeof c.index === "number" && Number.isInteger(c.index)) || c.index < 0 || c.index > 10000) {
        throw invalid(`choices[${i}].index must be an integer in 0..10000`);
      }
    });
    if (new Set(choices.map((c) => c.index)).size !== choices.length) throw invalid("choices have duplicate index values");
    return checkDigests(body[DIGESTS]);
  }

  // --- timestamps (records._parse_time: datetime.fromisoformat of CPython 3.11's C code) ---

  const DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
  const isLeap = (y) => y % 4 === 0 && (y % 100 !== 0 || y % 400 === 0);
  const daysIn = (y, m) => (m === 2 && isLeap(y) ? 29 : DAYS_IN_MONTH[m - 1]);

  function utcDate(y, m, d) {
    const date = new Date(0);
    date.setUTCFullYear(y, m - 1, d);
    date.setUTCHours(0, 0, 0, 0);
    return date;
  }

  /** datetime.fromisoformat(s) (C implementation): whether it parses, and with a zone. */
  function fromIsoFormat(s) {
    const chars = Array.from(s); // code points, as Python indexes a str
    if (chars.length < 7) return null;
    for (const pos of [7, 8, 10]) {
      if (pos > chars.length) break;
      const c = pos < chars.length ? chars[pos].codePointAt(0) : 0;
      if (c >= 0xd800 && c <= 0xdfff) {
        chars[pos] = "T";
        break;
      }
    }
    const clean = chars.join("");
    if (!isWellFormed(clean)) return null;
    const buf = UTF8.encode(clean);
    const len = buf.length;
    const at = (k) => (k >= 0 && k < len ? buf[k] : 0); // C reads the terminating NUL
    const isDigit = (c) => c >= 0x30 && c <= 0x39;
    const digits = (p, count) => {
      let v = 0;
      for (let k = 0; k < count; k++) {
        const c = at(p + k);
        if (!isDigit(c)) return null;
        v = v * 10 + (c - 0x30);
      }
      return v;
    };

    // _find_isoformat_datetime_separator
    let sep;
    if (len === 7) sep = 7;
    else if (at(4) === 0x2d) {
      if (at(5) === 0x57) {
        if (len > 8 && at(8) === 0x2d) {
          if (len === 9) return null;
          sep = len > 10 && isDigit(at(10)) ? 8 : 10;
        } else sep = 8;
      } else sep = 10;
    } else if (at(4) === 0x57) {
      let idx = 7;
      while (idx < len && isDigit(at(idx))) idx++;
      sep = idx < 9 ? idx : idx % 2 === 0 ? 7 : 8;
    } else sep = 8;

    // parse_isoformat_date
    let p = 0;
    const year = digits(p, 4);
    if (year === null) return null;
    p += 4;
    const usesSep = at(p) === 0x2d;
    if (usesSep) p++;
    let month;
    let day;
    if (at(p) === 0x57) {
      p++;
      const week = digits(p, 2);
      if (week === null) return null;
      p += 2;
      let isoDay = 1;
      if (p < sep) {
        if (usesSep && at(p++) !== 0x2d) return null;
        isoDay = digits(p, 1);
        if (isoDay === null) return null;
      }
      if (week <= 0 || week >= 53) {
        const first = utcDate(year, 1, 1).getUTCDay(); // ordinal % 7: Monday 1 ... Sunday 0
        if (!(week === 53 && (first === 4 || (first === 3 && isLeap(year))))) return null;
      }
      if (isoDay <= 0 || isoDay >= 8) return null;
      const jan4 = utcDate(year, 1, 4);
      const monday = jan4.getTime() - ((jan4.getUTCDay() + 6) % 7) * 86400000;
      const date = new Date(monday + ((week - 1) * 7 + isoDay - 1) * 86400000);
      [month, day] = [date.getUTCMonth() + 1, date.getUTCDate()];
      if (date.getUTCFullYear() < 1 || date.getUTCFullYear() > 9999) return null;
    } else {
      month = digits(p, 2);
      if (month === null) return null;
      p += 2;
      if (usesSep && at(p++) !== 0x2d) return null;
      day = digits(p, 2);
      if (day === null) return null;
      if (year < 1 || month < 1 || month > 12 || day < 1 || day > daysIn(year, month)) return null;
    }

    // parse_hh_mm_ss_ff over [p, end): [hour, minute, second, micro, rv] or null
    const hhmmss = (start, end) => {
      const vals = [0, 0, 0, 0];
      let q = start;
      let hasSep = true;
      let k = 0;
      for (; k < 3; k++) {
        const v = digits(q, 2);
        if (v === null) return null;
        vals[k] = v;
        q += 2;
        const c = at(q++);
        if (k === 0) hasSep = c === 0x3a;
        if (q >= end) return [...vals, c !== 0 ? 1 : 0];
        else if (hasSep && c === 0x3a) continue;
        else if (c === 0x2e || c === 0x2c) break;
        else if (!hasSep) q--;
        else return null;
      }
      const remains = end - q;
      const toParse = Math.min(remains, 6);
      const frac = digits(q, toParse);
      if (frac === null) return null;
      vals[3] = toParse > 0 && toParse < 6 ? frac * 10 ** (6 - toParse) : frac;
      q += toParse;
      while (isDigit(at(q))) q++;
      return [...vals, at(q) !== 0 ? 1 : 0];
    };

    let hour = 0;
    let minute = 0;
    let second = 0;
    let micro = 0;
    let aware = false;
    let offsetMicros = 0;
    if (len > sep) {
      let t = sep;
      const lead = at(t);
      t += (lead & 0x80) === 0 ? 1 : (lead & 0xf0) === 0xe0 ? 3 : (lead & 0xf0) === 0xf0 ? 4 : 2;
      const end = len;
      let tz = t;
      do {
        const c = at(tz);
        if (c === 0x5a || c === 0x2b || c === 0x2d) break;
      } while (++tz < end);
      const time = hhmmss(t, tz);
      if (time === null) return null;
      [hour, minute, second, micro] = time;
      if (tz === end) {
        if (time[4] === 1) return null;
      } else if (at(tz) === 0x5a) {
        if (at(tz + 1) !== 0) return null;
        aware = true;
      } else {
        const sign = at(tz) === 0x2d ? -1 : 1;
        const zone = hhmmss(tz + 1, end);
        if (zone === null || zone[4]) return null;
        offsetMicros = sign * ((zone[0] * 3600 + zone[1] * 60 + zone[2]) * 1e6 + zone[3]);
        if (Math.abs(offsetMicros) >= 86400e6) return null;
        aware = true;
      }
    }
    if (hour > 23 || minute > 59 || second > 59 || micro > 999999) return null;
    return { year, month, day, hour, minute, second, micro, aware, offsetMicros };
  }

  /** records._parse_time. */
  function parseTime(value, field) {
    if (!isStr(value)) throw invalid(`${field} must be an RFC 3339 string`);
    const parsed = fromIsoFormat(value.replace(/Z/g, "+00:00"));
    if (!parsed) throw invalid(`${field} is not RFC 3339: ${show(value)}`);
    if (!parsed.aware) throw invalid(`${field} must carry a time zone (use Z for UTC)`);
    return parsed;
  }

  // --- disclosures (ledger/disclosures.py) ------------------------------------------------

  const MEMBER = /^(request|request_raw|prompt_token_ids|replay_output|choices\[(0|[1-9][0-9]{0,4})\]\.(token_ids|text|logprobs|top_logprobs|margins))$/;
  const SALT_BYTES = 16;
  const MAX_DISCLOSURE = 64 * 1024 * 1024;
  const disclosureFail = (check, message) => new LedgerError(message, "invalid_disclosure", check);

  /** disclosures.parse (check "encoding"). */
  function parseDisclosure(encoded) {
    if (!isStr(encoded) || !encoded || encoded.length > MAX_DISCLOSURE) {
      throw disclosureFail("encoding", "a disclosure must be a non-empty base64url string");
    }
    let value;
    try {
      const text = UTF8_STRICT.decode(unb64url(encoded));
      value = parseJson(text, "orjson");
      if (canon(value, 0) !== text) throw new Error("not RFC 8785 canonical JSON");
    } catch (e) {
      throw disclosureFail("encoding", `a disclosure does not decode: ${e.message}`);
    }
    if (!isList(value) || value.length !== 3) throw disclosureFail("encoding", "a disclosure must be the array [salt, member, value]");
    const [salt, member, inner] = value;
    if (!isStr(salt) || !isStr(member)) throw disclosureFail("encoding", "a disclosure's salt and member must be strings");
    let saltBytes;
    try {
      saltBytes = unb64url(salt);
    } catch (e) {
      throw disclosureFail("encoding", "a disclosure's salt must be base64url");
    }
    if (saltBytes.length < SALT_BYTES) throw disclosureFail("encoding", `a disclosure's salt must hold at least ${SALT_BYTES} bytes`);
    if (!MEMBER.test(member)) throw disclosureFail("encoding", `unknown disclosure member ${show(member.slice(0, 80))}`);
    return { encoded, salt, member, value: inner };
  }

  /** disclosures.open_disclosures: member name -> disclosure (checks encoding, digest, unique). */
  async function openDisclosures(digests, encoded) {
    const wanted = new Set(digests);
    const opened = new Map();
    const used = new Set();
    for (let i = 0; i < encoded.length; i++) {
      const d = parseDisclosure(encoded[i]);
      d.digest = "sha256:" + hex(await sha256(UTF8.encode(d.encoded)));
      if (!wanted.has(d.digest)) throw disclosureFail("digest", `disclosure ${i} (${d.member}) opens none of the body's digests`);
      if (used.has(d.digest) || opened.has(d.member)) throw disclosureFail("unique", `disclosure ${i} (${d.member}) is disclosed twice`);
      used.add(d.digest);
      opened.set(d.member, d);
    }
    return opened;
  }

  /** inference_record.parse_record(body, disclosures) as evidence reads it: the schema
   * version, the body's digests and the disclosures opened. */
  async function parseRecord(body, disclosures) {
    const version = checkVersion(body, [1, 2]);
    if (version === 1) {
      if (disclosures.length) throw invalid("a schema version 1 record has no disclosures");
      validateRecordV1(body);
      return { schemaVersion: 1, digests: [], opened: new Map() };
    }
    const digests = checkClear(body);
    checkCommon(body);
    return { schemaVersion: 2, digests, opened: await openDisclosures(digests, disclosures) };
  }

  // --- bundle members (ledger/evidence_format.py) -----------------------------------------

  const TOP = [
    ["format", "str"], ["request_id", "str"], ["envelope", "dict"], ["leaf_index", "int"],
    ["leaf_hash", "str"], ["inclusion_proof", "dict"], ["checkpoint", "str"],
    ["fingerprint", "dict"], ["keys", "dict"], ["replays", "list"], ["disclosures", "list"],
    ["erasure", "dict"], ["exported_at", "str"],
  ];
  const TOP_V3_OPTIONAL = ["erasure"];
  const TOP_V3_ONLY = ["disclosures", "erasure"];
  const TOP_V1_OPTIONAL = ["replays"];
  const TOP_V1_ABSENT = ["fingerprint"];
  const PROOF = [["tree_size", "int"], ["hashes", "list"]];
  const KEYS = [["collector", "dict"], ["fingerprint_signer", "dict"], ["log", "dict"]];
  const KEYS_V1 = [["collector", "dict"], ["log", "dict"]];
  const KEY = [["key_id", "str"], ["name", "str"], ["role", "str"], ["public_key", "str"], ["registration", "dict"]];
  const LOG_KEY = [["key_id", "str"], ["public_key", "str"], ["origin", "str"], ["vkey", "str"]];
  const LEAF = [["envelope", "dict"], ["leaf_index", "int"], ["hashes", "list"]];

  function members(obj, schema, where, optional) {
    if (!isDict(obj)) throw fail("format", `${where} must be a JSON object`);
    const names = schema.map(([name]) => name);
    const unknown = Object.keys(obj).filter((k) => !names.includes(k));
    if (unknown.length) throw fail("format", `${where} has members the format does not define: ${sorted(unknown)}`);
    for (const [name, type] of schema) {
      if (!has(obj, name)) {
        if (optional && optional.includes(name)) continue;
        throw fail("format", `member ${where}.${name} is missing`);
      }
      if (!TYPES[type](obj[name])) throw fail("format", `member ${where}.${name} must be a JSON ${TYPE_NAMES[type]}`);
    }
    return obj;
  }

  function envelopeAt(data, where) {
    try {
      return envelopeFrom(data);
    } catch (e) {
      if (e instanceof LedgerError) throw fail("format", `${where}: ${e.message}`);
      throw e;
    }
  }

  function hashesAt(items, where) {
    try {
      return items.map((h) => a2b(h));
    } catch (e) {
      throw fail("format", `${where} holds a value that is not base64: ${e.message}`);
    }
  }

  function leafAt(member, where) {
    const leaf = members(member, LEAF, where);
    return {
      envelope: envelopeAt(leaf.envelope, `${where}.envelope`),
      index: leaf.leaf_index,
      proof: hashesAt(leaf.hashes, `${where}.hashes`),
    };
  }

  async function keyAt(entry, where) {
    let key;
    try {
      key = await loadPublicKey(entry.public_key);
    } catch (e) {
      if (e instanceof LedgerError) throw fail("format", `${where}.public_key is not valid: ${e.message}`);
      throw e;
    }
    if (key.keyId !== entry.key_id) throw fail("format", `${where}.key_id is not the ID of ${where}.public_key`);
    // ledger.evidence_format._key: one spelling, the one the ledger writes.
    if (entry.public_key !== KEY_ID_PREFIX + b64encode(key.raw)) {
      throw fail("format", `${where}.public_key is not written as ed25519:<base64 of the key>`);
    }
    return key;
  }

  async function keyEntryAt(member, where) {
    const entry = members(member, KEY, where);
    return {
      key: await keyAt(entry, where),
      name: entry.name,
      role: entry.role,
      public_key: entry.public_key,
      registration: leafAt(entry.registration, `${where}.registration`),
    };
  }

  async function logKeyEntryAt(member, where) {
    const entry = members(member, LOG_KEY, where);
    return { key: await keyAt(entry, where), origin: entry.origin, vkey: entry.vkey };
  }

  /** evidence_format.parse_bundle: the "format" check. */
  async function parseBundle(bundle) {
    if (!isDict(bundle) || !isStr(get(bundle, "format"))) {
      throw fail("format", "not an evidence bundle: member 'format' is missing");
    }
    const version = bundle.format;
    if (!FORMATS.includes(version)) {
      throw fail("format", `unknown bundle format ${show(version)}; reads ${FORMATS.join(", ")}`);
    }
    const v1 = version === FORMAT_V1;
    if (v1 && TOP_V1_ABSENT.some((k) => has(bundle, k))) throw fail("format", `a ${FORMAT_V1} bundle has no member 'fingerprint'`);
    const v3 = version === FORMAT;
    if (!v3 && TOP_V3_ONLY.some((k) => has(bundle, k))) {
      throw fail("format", `a ${version} bundle has no member 'disclosures' or 'erasure'`);
    }
    const optional = v1 ? [...TOP_V1_OPTIONAL, ...TOP_V1_ABSENT, ...TOP_V3_ONLY] : v3 ? TOP_V3_OPTIONAL : TOP_V3_ONLY;
    const top = members(bundle, TOP, "bundle", optional);
    const proof = members(top.inclusion_proof, PROOF, "inclusion_proof");
    const keys = members(top.keys, v1 ? KEYS_V1 : KEYS, "keys");
    const collector = await keyEntryAt(keys.collector, "keys.collector");
    const signer = v1 ? null : await keyEntryAt(keys.fingerprint_signer, "keys.fingerprint_signer");
    const log = await logKeyEntryAt(keys.log, "keys.log");
    const record = envelopeAt(top.envelope, "envelope");
    if (record.kind !== RECORD_KIND) throw fail("format", `the envelope is a ${show(record.kind)}, not an '${RECORD_KIND}'`);
    if (!v3 && !pyEq(get(record.body, "schema_version"), 1)) {
      throw fail("format", `a ${version} bundle carries schema version 1 records only`);
    }
    let leafHash;
    try {
      leafHash = a2b(top.leaf_hash);
    } catch (e) {
      throw fail("format", `leaf_hash is not base64: ${e.message}`);
    }
    const replays = has(top, "replays") ? top.replays : [];
    return {
      format: version,
      requestId: top.request_id,
      record,
      leafIndex: top.leaf_index,
      leafHash,
      treeSize: proof.tree_size,
      proof: hashesAt(proof.hashes, "inclusion_proof.hashes"),
      checkpoint: top.checkpoint,
      collector,
      log,
      fingerprint: v1 ? null : leafAt(top.fingerprint, "fingerprint"),
      fingerprintSigner: signer,
      replays: replays.map((item, i) => leafAt(item, `replays[${i}]`)),
      disclosures: has(top, "disclosures") ? top.disclosures : [],
      erasure: has(top, "erasure") ? leafAt(top.erasure, "erasure") : null,
    };
  }

  // --- the checks (ledger/evidence.py, ledger/evidence_content.py) ------------------------

  const jsonInt = (v) => (typeof v === "bigint" ? (v <= MAX_SAFE_BIG && v >= -MAX_SAFE_BIG ? Number(v) : v.toString()) : v);

  /** A verification run: memoizes what bundles share (a key's registration proven once). */
  class Run {
    constructor() {
      this.memo = new Map();
    }

    once(key, fn) {
      let p = this.memo.get(key);
      if (!p) {
        p = fn();
        this.memo.set(key, p);
        p.catch(() => this.memo.delete(key));
      }
      return p;
    }

    /** evidence._verified_signature: the envelope is signed by the key. */
    signed(env, key) {
      return this.once(`sig|${key.keyId}|${env.canonicalText}`, () => verifyEnvelope(env, key));
    }

    /** evidence._verified_inclusion: the envelope's leaf is at index in the checkpoint's tree. */
    included(env, index, cp, proof) {
      const id = `inc|${index}|${cp.treeSize}|${proof.map(b64encode).join(",")}|${env.canonicalText}`;
      return this.once(id, async () => verifyInclusion(await env.leafHash(), index, cp.treeSize, proof, cp.rootHash));
    }

    /** evidence_content.verify_log_leaf. */
    async logLeaf(item, cp, logKey) {
      await verifyEnvelope(item.envelope, logKey);
      await verifyInclusion(await item.envelope.leafHash(), item.index, cp.treeSize, item.proof, cp.rootHash);
    }
  }

  async function wrap(check, promise, prefix) {
    try {
      return await promise;
    } catch (e) {
      if (e instanceof LedgerError) throw fail(check, (prefix || "") + e.message, e.code);
      throw e;
    }
  }

  /** ledger.key_scope: the kinds a collector key signs that name a pool. */
  const POOL_MEMBER = new Map([["inference_record", "pool"], ["worker_heartbeat", "pool"]]);

  /** key_scope.registered_pools: null (any pool), or the pools (a malformed member: none). */
  function registeredPools(body) {
    if (!has(body, "pools")) return null;
    const value = body.pools;
    return isList(value) && value.every(isStr) ? value : [];
  }

  /** key_scope.out_of_scope: why a signed body names a pool outside its key's pools. */
  function outOfScope(pools, kind, body) {
    const member = POOL_MEMBER.get(kind);
    if (member === undefined || pools === null) return null;
    const pool = get(body, member);
    if (isStr(pool) && pools.includes(pool)) return null;
    const allowed = pools.length ? "only for " + pools.map(show).join(", ") : "for no pool";
    return `${kind} names pool ${show(pool)}, but its key may sign ${allowed}`;
  }

  /** evidence._verify_key. */
  async function verifyKey(run, check, entry, signed, signedIndex, cp, logKey) {
    const reg = entry.registration;
    const body = reg.envelope.body;
    if (reg.envelope.kind !== REGISTRATION_KIND || !pyEq(get(body, "key_id"), signed.keyId)) {
      throw fail(check, "the registration is not of the key that signed the leaf");
    }
    for (const member of ["key_id", "name", "role", "public_key"]) {
      const held = member === "key_id" ? entry.key.keyId : entry[member];
      if (!pyEq(get(body, member), held)) throw fail(check, `the bundle's key ${member} differs from the one registered`);
    }
    const role = get(body, "role");
    const kinds = (isStr(role) && SIGNABLE_KINDS.get(role)) || [];
    if (!kinds.includes(signed.kind)) throw fail(check, `a ${show(role)} key may not sign ${show(signed.kind)}`);
    const problem = outOfScope(registeredPools(body), signed.kind, signed.body);
    if (problem !== null) throw fail(check, problem);
    if (reg.index >= signedIndex) throw fail(check, "the key was registered after the leaf it signed was logged");
    await wrap(check, run.signed(reg.envelope, logKey));
    await wrap(check, run.included(reg.envelope, reg.index, cp, reg.proof));
    return reg.index;
  }

  function fingerprintFacts(body, fingerprintId, leafIndex, signerKeyId) {
    const section = (name) => (isDict(get(body, name)) ? body[name] : Object.create(null));
    const model = section("model");
    const engine = section("engine");
    const gpu = section("gpu");
    const devices = get(gpu, "gpus");
    const unknown = get(gpu, "unknown");
    return {
      fingerprint_id: fingerprintId,
      leaf_index: jsonInt(leafIndex),
      signer_key_id: signerKeyId,
      model_digest: shown(get(model, "digest")),
      engine_name: shown(get(engine, "name")),
      engine_version: shown(get(engine, "version")),
      gpus: (isList(devices) ? devices : []).map((d) => shown(isDict(d) ? get(d, "name") : d)),
      gpus_unknown: isDict(unknown) ? shown(get(unknown, "gpus")) : null,
      driver_version: shown(get(gpu, "driver_version")),
      batch_invariance: shown(get(engine, "batch_invariance")),
    };
  }

  /** evidence._verify_replays. */
  async function verifyReplays(run, items, record, recordIndex, cp, logKey) {
    const verdicts = [];
    let previous = recordIndex;
    for (let i = 0; i < items.length; i++) {
      const item = items[i];
      const env = item.envelope;
      const body = env.body;
      if (env.kind !== VERDICT_KIND || !pyEq(get(body, "request_id"), get(record.body, "request_id"))) {
        throw fail("replays", `replays[${i}] is not a verdict about this record`);
      }
      const about = isDict(get(body, "record")) ? body.record : Object.create(null);
      if (!pyEq(get(about, "content_hash"), await record.bodyDigest())) {
        throw fail("replays", `replays[${i}] compares another version of the record`);
      }
      if (!pyEq(get(about, "log_index"), recordIndex)) throw fail("replays", `replays[${i}] names another leaf index for the record`);
      if (!pyEq(get(about, "fingerprint_id"), get(record.body, "fingerprint_id"))) {
        throw fail("replays", `replays[${i}] names another fingerprint for the record`);
      }
      if (item.index <= previous) throw fail("replays", `replays[${i}] is logged before the record or out of leaf order`);
      previous = item.index;
      await wrap("replays", run.logLeaf(item, cp, logKey), `replays[${i}]: `);
      verdicts.push({
        replay_id: shown(get(body, "replay_id")),
        leaf_index: jsonInt(item.index),
        verdict: shown(get(body, "verdict")),
        pool: shown(get(body, "pool")),
        worker_id: shown(get(body, "worker_id")),
        worker_key_id: shown(get(body, "worker_key_id")),
      });
    }
    return verdicts;
  }

  /** evidence_content._verify_erasure. */
  async function verifyErasure(run, item, record, recordIndex, cp, logKey) {
    const env = item.envelope;
    const body = env.body;
    if (env.kind !== ERASURE_KIND || !pyEq(get(body, "request_id"), get(record.body, "request_id"))) {
      throw fail("erasure", "the erasure member is not an erasure event of this record");
    }
    const about = isDict(get(body, "record")) ? body.record : Object.create(null);
    if (!pyEq(get(about, "content_hash"), await record.bodyDigest()) || !pyEq(get(about, "log_index"), recordIndex)) {
      throw fail("erasure", "the erasure event names another version or leaf of the record");
    }
    if (item.index <= recordIndex) throw fail("erasure", "the erasure event is logged before the record");
    const digests = get(body, "erased_digests");
    if (!isList(digests) || !digests.every(isStr)) throw fail("erasure", "the erasure event's erased_digests is not a list of digests");
    await wrap("erasure", run.logLeaf(item, cp, logKey), "erasure: ");
    return {
      summary: {
        leaf_index: jsonInt(item.index),
        reason_code: shown(get(body, "reason_code")),
        reason: shown(get(body, "reason")),
        requested_by: shown(get(body, "requested_by")),
        erased_at: shown(get(body, "erased_at")),
      },
      erased: new Set(digests),
    };
  }

  const short = (keyId) => (isStr(keyId) && keyId.length > 24 ? keyId.slice(0, 24) + "\u2026" : keyId);
  const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;

  /**
   * The checks of ledger.evidence.verify_bundle, in order. ``pass(check, message)`` reports
   * each that passes; a failure throws CheckFailure naming its check.
   */
  async function runChecks(input, pinned, pass, skip) {
    const run = new Run();
    const b = await parseBundle(readBundle(input));
    pass("format", `a well-formed ${b.format.split("/").pop()} bundle: every member present, typed and decoded`);
    const record = b.record;
    const index = b.leafIndex;

    const leaf = await record.leafHash();
    if (!bytesEqual(leaf, b.leafHash)) throw fail("jcs", "the envelope's canonical bytes do not hash to the logged leaf");
    pass("jcs", "the envelope's RFC 8785 canonical bytes hash to the logged leaf");

    await wrap("collector_signature", verifyEnvelope(record, b.collector.key));
    pass("collector_signature", `the record is signed by the collector key ${short(record.keyId)}`);

    if (!pyEq(b.requestId, get(record.body, "request_id"))) {
      throw fail("request_id", "request_id differs from the request ID the collector signed");
    }
    pass("request_id", `request_id ${b.requestId} is the one the collector signed`);

    const logKey = b.log.key;
    if (pinned && !bytesEqual(pinned.raw, logKey.raw)) {
      throw fail("log_key_pin", "the checkpoint is signed by a key other than the pinned log key", "log_key_mismatch");
    }
    pass("log_key_pin", pinned ? `the log key is the pinned key ${short(logKey.keyId)}` : null);

    const cp = await wrap("checkpoint_signature", verifyCheckpoint(b.checkpoint, logKey.raw));
    if (b.log.origin !== cp.origin) throw fail("checkpoint_signature", "keys.log.origin is not the checkpoint's origin");
    if (b.log.vkey !== (await verifierKey(cp.origin, logKey.raw))) {
      throw fail("checkpoint_signature", "keys.log.vkey is not the log key's verifier key");
    }
    const at = cp.signedAtNs !== null ? isoFromNs(cp.signedAtNs) : null;
    pass(
      "checkpoint_signature",
      `the checkpoint of ${cp.treeSize} entries (${cp.origin}) is signed by the log key` + (at ? `, at ${at}` : "")
    );

    if (!pyEq(cp.treeSize, b.treeSize)) {
      throw fail("inclusion_proof", `proof is for tree size ${b.treeSize}, the checkpoint for ${cp.treeSize}`, "bad_inclusion_proof");
    }
    await wrap("inclusion_proof", verifyInclusion(leaf, index, cp.treeSize, b.proof, cp.rootHash));
    pass("inclusion_proof", `leaf ${index} is in the tree of ${cp.treeSize} entries signed by the log key`);

    const collectorReg = await verifyKey(run, "collector_key", b.collector, record, index, cp, logKey);
    pass(
      "collector_key",
      `the collector key "${b.collector.name}" (${b.collector.role}) was registered by the log key at leaf ${collectorReg}, before the record`
    );

    let facts = null;
    if (b.fingerprint && b.fingerprintSigner) {
      const fp = b.fingerprint;
      const env = fp.envelope;
      if (env.kind !== FINGERPRINT_KIND) throw fail("fingerprint", `the fingerprint member holds a ${show(env.kind)} envelope`);
      const named = get(record.body, "fingerprint_id");
      const digest = await env.bodyDigest();
      if (!pyEq(digest, named)) {
        throw fail(
          "fingerprint",
          `the fingerprint's canonical body hashes to ${digest}, but the record names ${show(named)}`,
          "fingerprint_mismatch"
        );
      }
      if (fp.index >= index) throw fail("fingerprint", "the fingerprint is logged after the record that names it");
      pass("fingerprint", `the fingerprint the record names (${short(digest)}) is logged at leaf ${fp.index}, before the record`);
      await wrap("fingerprint_signature", run.signed(env, b.fingerprintSigner.key));
      pass("fingerprint_signature", `the fingerprint is signed by ${short(env.keyId)}`);
      await wrap("fingerprint_inclusion", run.included(env, fp.index, cp, fp.proof));
      pass("fingerprint_inclusion", `leaf ${fp.index} (the fingerprint) is in the same tree of ${cp.treeSize} entries`);
      facts = fingerprintFacts(env.body, digest, fp.index, env.keyId);
      const signer = b.fingerprintSigner;
      const signerReg = await verifyKey(run, "fingerprint_key", signer, env, fp.index, cp, logKey);
      pass(
        "fingerprint_key",
        `the fingerprint's signing key "${signer.name}" (${signer.role}) was registered by the log key at leaf ${signerReg}, before the fingerprint`
      );
    } else {
      skip(FINGERPRINT_CHECKS, `not included: bundles of format ${FORMAT_V1} carry no fingerprint`);
    }

    const replays = await verifyReplays(run, b.replays, record, index, cp, logKey);
    pass(
      "replays",
      replays.length
        ? `${plural(replays.length, "replay verdict", "replay verdicts")} (${replays.map((r) => r.verdict).join(", ")}), each signed by the log key, about this record and in the tree`
        : "the bundle carries no replay verdict"
    );

    let parsed;
    try {
      parsed = await parseRecord(record.body, b.disclosures);
    } catch (e) {
      if (!(e instanceof LedgerError)) throw e;
      if (e.code === "invalid_disclosure") throw fail("disclosures", e.message, e.code);
      throw fail("disclosures", `the record body is not a valid record: ${e.message}`);
    }
    pass(
      "disclosures",
      parsed.schemaVersion === 1
        ? "a schema v1 record: its content is in the signed record itself"
        : `${parsed.opened.size} of the record's ${plural(parsed.digests.length, "committed member", "committed members")} disclosed, each opening one digest the collector signed`
    );

    let erasure = null;
    let erased = new Set();
    if (b.erasure) {
      ({ summary: erasure, erased } = await verifyErasure(run, b.erasure, record, index, cp, logKey));
      const committed = new Set(parsed.digests);
      for (const r of b.replays) {
        const out = get(r.envelope.body, "output_digest");
        if (isStr(out)) committed.add(out);
      }
      const unknown = [...erased].filter((d) => !committed.has(d)).length;
      if (unknown) {
        throw fail(
          "erasure",
          `the erasure event names ${unknown} digest(s) that neither the record nor its replay verdicts in this bundle commit to`
        );
      }
      pass(
        "erasure",
        `the record's content was erased (${erasure.reason_code || "no reason code"}` +
          (erasure.erased_at ? `, at ${erasure.erased_at}` : "") +
          `): the event is signed by the log key at leaf ${erasure.leaf_index}, after the record`
      );
    } else {
      pass("erasure", "the bundle carries no erasure event");
    }

    const byDigest = new Map([...parsed.opened.values()].map((d) => [d.digest, d.member]));
    const content = parsed.digests.map((digest) => {
      const member = byDigest.has(digest) ? byDigest.get(digest) : null;
      const status = member !== null ? "disclosed" : erased.has(digest) ? "erased" : "redacted";
      const label =
        status === "disclosed" ? `disclosed: ${member}` : status === "erased" ? "erased" : "redacted in this bundle";
      return { digest, member, status, label };
    });

    return {
      format: b.format,
      checks: facts ? [...CHECKS] : CHECKS.filter((c) => !FINGERPRINT_CHECKS.includes(c)),
      skipped_checks: facts ? [] : [...FINGERPRINT_CHECKS],
      request_id: b.requestId,
      kind: record.kind,
      leaf_index: jsonInt(index),
      tree_size: jsonInt(cp.treeSize),
      root_hash: b64encode(cp.rootHash),
      origin: cp.origin,
      checkpoint_signed_at: at,
      collector_key_id: record.keyId,
      collector_name: b.collector.name,
      collector_role: b.collector.role,
      log_key_id: logKey.keyId,
      log_key_pinned: Boolean(pinned),
      fingerprint: facts,
      replays,
      replay_verdicts: replays.map((r) => String(r.verdict === null ? "None" : r.verdict)),
      content: { schema_version: parsed.schemaVersion, content, erasure },
    };
  }

  /**
   * Verify an evidence bundle fully offline.
   *
   * bundle: the bundle's JSON text (string, ArrayBuffer or Uint8Array: read exactly as
   *   `ledger verify` reads the file), or an object from JSON.parse (see the header).
   * pinnedKey: the log's public key obtained out of band (parsePinnedKey's result, or a key
   *   text it accepts), or null: then the bundle is checked against the log key it carries,
   *   which proves self-consistency only (log_key_pin is reported not pinned).
   * onStep: optional callback(step), called for each step in order as it is settled.
   *
   * Resolves to {valid, pinned, steps: [{check, ok, status, message}], failed, code, message,
   * summary, elapsed_ms}; steps lists every check of CHECKS, in order. status is "passed" (ok
   * true), "not_pinned" (log_key_pin without a pinned key: ok true, pinned false), "skipped"
   * (ok null: the fingerprint checks, which a v1 bundle cannot be checked for), "failed" (ok
   * false: the first check that failed; verification stops there, as in Python) or "not_run"
   * (ok null: the checks after it). summary (null unless valid) holds what ledger verify reports: VerifiedBundle's
   * fields, with Python's names.
   */
  async function verifyBundle(bundle, pinnedKey, onStep) {
    const started = global.performance ? global.performance.now() : Date.now();
    await ensureEd25519(); // fail at once, and loudly, outside a secure context or without Ed25519
    let pinned = pinnedKey || null;
    if (typeof pinned === "string") pinned = await parsePinnedKey(pinned);
    if (pinned && !(pinned.raw instanceof Uint8Array && pinned.raw.length === 32)) {
      throw new TypeError("pinnedKey must be parsePinnedKey's result ({raw: Uint8Array(32), keyId})");
    }
    const steps = [];
    const notify = (step) => {
      steps.push(step);
      if (typeof onStep === "function") {
        try {
          onStep(step);
        } catch (e) {
          /* a page's callback never changes the verdict */
        }
      }
    };
    const pass = (check, message) => {
      if (check === "log_key_pin" && !pinned) {
        notify({
          check,
          ok: true,
          status: "not_pinned",
          pinned: false,
          message:
            "no log key pinned: the bundle was checked against the log key it carries, which " +
            "shows self-consistency only; pin the log's key, obtained out of band, to rule out a forged log",
        });
      } else notify({ check, ok: true, status: "passed", message });
    };
    const skip = (checks, message) => checks.forEach((check) => notify({ check, ok: null, status: "skipped", message }));

    let summary = null;
    let failure = null;
    try {
      summary = await runChecks(bundle, pinned, pass, skip);
    } catch (e) {
      const current = CHECKS.find((c) => !steps.some((s) => s.check === c)) || "format";
      failure =
        e instanceof CheckFailure
          ? e
          : new CheckFailure(current, `internal error while checking: ${e && e.message ? e.message : e}`, "internal_error");
      notify({ check: failure.check, ok: false, status: "failed", message: failure.message, code: failure.code });
      for (const check of CHECKS) {
        if (!steps.some((s) => s.check === check)) {
          notify({ check, ok: null, status: "not_run", message: `not run: check ${failure.check} failed first` });
        }
      }
    }
    const elapsed = (global.performance ? global.performance.now() : Date.now()) - started;
    return {
      valid: failure === null,
      pinned: Boolean(pinned),
      steps,
      failed: failure ? failure.check : null,
      code: failure ? failure.code : null,
      message: failure ? failure.message : null,
      summary,
      elapsed_ms: elapsed,
    };
  }

  /**
   * The log's public key, pinned out of band: a PEM "-----BEGIN PUBLIC KEY-----" Ed25519 key
   * (log-key.pub.pem, as `ledger serve` writes it), a C2SP verifier key
   * "<name>+<hex key hash>+<base64(0x01 || key)>" (its key hash is checked), or
   * "ed25519:<base64 raw>". Resolves to {raw: Uint8Array(32), keyId: "ed25519:<hex>"} (plus
   * name for a verifier key); rejects with an Error saying what is wrong.
   */
  async function parsePinnedKey(text) {
    await ensureEd25519();
    if (!isStr(text)) throw new Error("a pinned log key must be text (PEM, or a C2SP verifier key)");
    const trimmed = text.trim();
    if (!trimmed) throw new Error("no log key given");
    if (/^-----BEGIN [A-Z ]*PRIVATE KEY-----/.test(trimmed)) {
      throw new Error("this is a private key: pin the log's public key (log-key.pub.pem, or its vkey)");
    }
    let bare = null;
    try {
      bare = a2b(trimmed);
    } catch (e) {
      bare = null;
    }
    const isVkey =
      !trimmed.startsWith("-----BEGIN") &&
      !trimmed.startsWith(KEY_ID_PREFIX) &&
      !(bare && bare.length === 32) && // bare base64 of the raw key, as load_public_key reads it
      trimmed.includes("+");
    if (isVkey) {
      const first = trimmed.indexOf("+");
      const name = trimmed.slice(0, first);
      const rest = trimmed.slice(first + 1);
      const second = rest.indexOf("+");
      if (!name || /\s/.test(name) || second < 0) {
        throw new Error("not a verifier key: expected <name>+<hex key hash>+<base64 key>");
      }
      const hashText = rest.slice(0, second);
      if (!/^[0-9a-f]{8}$/.test(hashText)) throw new Error("not a verifier key: its key hash must be 8 lowercase hex digits");
      let data;
      try {
        data = a2b(rest.slice(second + 1));
      } catch (e) {
        throw new Error(`not a verifier key: its key is not base64 (${e.message})`);
      }
      if (data.length !== 33 || data[0] !== 1) throw new Error("not a verifier key: not an Ed25519 key (type 0x01, 32 bytes)");
      const raw = data.slice(1);
      try {
        checkPublicKey(raw);
      } catch (e) {
        throw new Error(`not a usable log key: ${e.message}`);
      }
      if (hex(await noteKeyHash(name, raw)) !== hashText) {
        throw new Error(`the verifier key's key hash ${hashText} does not match its name and key`);
      }
      return { raw, keyId: await keyIdOf(raw), name };
    }
    try {
      const key = await loadPublicKey(trimmed);
      return { raw: key.raw.slice(), keyId: key.keyId };
    } catch (e) {
      throw new Error(e instanceof LedgerError ? e.message : `not an Ed25519 public key: ${e.message}`);
    }
  }

  global.LedgerVerify = Object.freeze({
    verifyBundle,
    parsePinnedKey,
    canonicalize,
    CHECKS,
    FINGERPRINT_CHECKS,
    FORMATS: Object.freeze([...FORMATS]),
    // the ports below are exposed for differential tests against the Python modules
    _internals: Object.freeze({
      parseJson: (text, mode) => parseJson(text, mode || "python"),
      a2b,
      unb64url,
      parseTime,
      fromIsoFormat,
      parseDisclosure,
      checkPublicKey,
      loadPublicKey,
      PyFloat,
    }),
  });
})(typeof window !== "undefined" ? window : globalThis);
