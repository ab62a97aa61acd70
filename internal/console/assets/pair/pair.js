"use strict";
// The pairing page, which an app device's invitation link opens
// (<base>/pair/#code=CODE&household=NAME): it shows the code and the
// household for a person to enter in the app, and hands both to an app
// that registered the flamenet-relay: scheme (docs/PROTOCOL.md,
// "Pairing"). It never redeems the code, and talks to no server: only the
// device the invitation was made for can use the code, once.
/** The scheme apps register to be handed a code (docs/PROTOCOL.md). */
const SCHEME = "flamenet-relay";
function el(id) {
    const e = document.getElementById(id);
    if (!e)
        throw new Error(`pair: no #${id}`);
    return e;
}
/**
 * The code and household of the link, taken off the address so that they
 * stay out of the history, as the console does. A fragment that is not
 * one (or does not decode) is no link.
 */
function takeLink() {
    const hash = location.hash;
    if (hash)
        history.replaceState(null, "", location.pathname + location.search);
    let params;
    try {
        params = new URLSearchParams(hash.slice(1));
    }
    catch {
        return { code: "", household: "" };
    }
    const code = params.get("code") ?? "";
    const household = params.get("household") ?? "";
    if (!/^[0-9A-Za-z -]{1,32}$/.test(code))
        return { code: "", household: "" };
    return { code, household: /^[A-Za-z0-9._-]{1,64}$/.test(household) ? household : "" };
}
/** The relay's base URL: this page is <base>/pair/. */
function relayBase() {
    return location.origin + location.pathname.replace(/\/pair\/(index\.html)?$/, "");
}
/**
 * Copies the code: the clipboard API where the page may use it (a secure
 * context), else the selection and the older copy command.
 */
async function copy(code) {
    try {
        await navigator.clipboard.writeText(code);
        return true;
    }
    catch {
        const sel = getSelection();
        sel?.selectAllChildren(el("code"));
        return document.execCommand("copy");
    }
}
function start() {
    const { code, household } = takeLink();
    if (!code) {
        el("none").hidden = false;
        return;
    }
    const relay = relayBase();
    el("code").textContent = code;
    el("household").textContent = household || "(the link names none)";
    el("relay").textContent = relay;
    const app = new URLSearchParams({ relay, code });
    if (household)
        app.set("household", household);
    el("open").href = `${SCHEME}://pair?${app.toString()}`;
    el("command").textContent = `relay pair -url ${relay} -code ${code} -store device.json`;
    el("copy").addEventListener("click", () => {
        void copy(code).then((ok) => {
            const said = el("copied");
            said.textContent = ok ? "Copied." : "Select the code and copy it.";
            said.hidden = false;
        });
    });
    el("invitation").hidden = false;
}
start();
