// The household console: pairs this browser as an admin device of its
// household (its credentials in localStorage, renewed by the client), lists
// the household's devices, removes one, and invites another. It talks to
// the relay that serves it (same origin) with the TypeScript client, and
// builds the page with DOM calls only: the page's policy allows no inline
// script and no HTML from strings.
import { RelayClient } from "./client/client.js";
import { LocalStorageCredentialStore, RenewingCredentials, pair } from "./client/credentials.js";
import { RelayError } from "./client/errors.js";
import { decodeBase64 } from "./client/base64.js";
import { fingerprint } from "./client/fingerprint.js";
const STORAGE_KEY = "relay-console";
const REFRESH_MS = 10_000;
const base = location.origin;
const store = new LocalStorageCredentialStore(STORAGE_KEY);
let creds;
let client;
let refreshTimer;
let qrURL;
function el(id) {
    const e = document.getElementById(id);
    if (!e)
        throw new Error(`console: no #${id}`);
    return e;
}
function show(id, on) {
    el(id).hidden = !on;
}
function say(id, text) {
    const e = el(id);
    e.textContent = text;
    e.hidden = text === "";
}
function node(tag, text = "", className = "") {
    const e = document.createElement(tag);
    if (text)
        e.textContent = text;
    if (className)
        e.className = className;
    return e;
}
/** Why a call failed, for people. */
function describe(e) {
    if (e instanceof RelayError) {
        if (e.status === 429)
            return `Too many attempts; try again in ${e.retryAfter ?? 60} seconds.`;
        if (e.message)
            return e.message;
    }
    return e instanceof Error ? e.message : String(e);
}
const noLink = { code: "", household: "", admin: false };
/**
 * The code, household and scope of a pairing link
 * (#pair=CODE&household=NAME&scope=admin), taken off the address so that
 * they stay out of the history. A fragment that is not one (or does not
 * decode) is no link.
 */
function takePairLink() {
    const hash = location.hash;
    if (hash)
        history.replaceState(null, "", location.pathname + location.search);
    let params;
    try {
        params = new URLSearchParams(hash.slice(1));
    }
    catch {
        return noLink;
    }
    const code = params.get("pair") ?? "";
    const household = params.get("household") ?? "";
    if (!/^[0-9A-Za-z -]{1,32}$/.test(code))
        return noLink;
    return { code, household: /^[A-Za-z0-9._-]{1,64}$/.test(household) ? household : "", admin: params.get("scope") === "admin" };
}
/** The link this page was opened with, while its code is in the form. */
let link = noLink;
/**
 * Shows the code of a link that does not say it is an admin's (an app
 * device's, or one made before links said their scope) for entering in
 * the app, and never offers to pair with it: the code is single use, and
 * a browser paired with it would be a device the console cannot use.
 */
function showAppLink(l, paired) {
    el("app-code").textContent = l.code;
    el("app-household").textContent = l.household || "(the link names none)";
    el("app-command").textContent = `relay pair -url ${base} -code ${l.code} -store device.json`;
    show("app-pair-admin", !paired);
    show("app-link", true);
}
function ago(iso) {
    const s = (Date.now() - Date.parse(iso)) / 1000;
    if (!Number.isFinite(s))
        return "never";
    if (s < 45)
        return "just now";
    if (s < 90)
        return "a minute ago";
    if (s < 3600)
        return `${Math.round(s / 60)} minutes ago`;
    if (s < 5400)
        return "an hour ago";
    if (s < 86400)
        return `${Math.round(s / 3600)} hours ago`;
    return new Date(iso).toLocaleDateString();
}
function until(iso) {
    const t = new Date(iso);
    const min = Math.round((t.getTime() - Date.now()) / 60000);
    const at = t.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    return min >= 1 ? `${at} (in ${min} minute${min === 1 ? "" : "s"})` : `${at} (in under a minute)`;
}
function showPair(code, notice = "") {
    stop();
    say("notice", notice);
    for (const id of ["who", "devices", "invite", "pending", "forget-bar"])
        show(id, false);
    show("pair", true);
    el("pair-household").textContent = link.household || "(not named)";
    show("pair-link", code !== "" && code === link.code);
    const input = el("code");
    input.value = code;
    input.focus();
}
function stop() {
    if (refreshTimer !== undefined)
        clearInterval(refreshTimer);
    refreshTimer = undefined;
    client = undefined;
    creds = undefined;
}
function forget() {
    stop();
    localStorage.removeItem(STORAGE_KEY);
}
function onState(s) {
    const e = el("state");
    e.className = `state ${s.kind}`;
    e.textContent = s.kind === "retrying" ? "reconnecting" : s.kind;
    if (s.kind === "unauthorized")
        void unauthorized();
}
/**
 * The relay refused this tab's credentials. Another tab may have renewed
 * the set meanwhile: then the saved set is another, and this tab opens it;
 * only the set that was refused is forgotten, never another tab's.
 */
async function unauthorized() {
    const mine = creds?.credentials.renewal_secret;
    const saved = await store.load();
    if (saved && mine !== undefined && saved.renewal_secret !== mine) {
        stop();
        await open();
        return;
    }
    forget();
    showPair("", "The relay refused this browser's credentials (it was removed, or they were used elsewhere): pair it again with a new admin invitation.");
}
/** Opens the saved credentials and shows the household. */
async function open() {
    const c = await RenewingCredentials.open(base, store);
    if (c.credentials.scope !== "admin") {
        forget();
        showPair("", "This browser was paired as a device without admin rights; the console needs an admin invitation (relay invite ... -scope admin).");
        return;
    }
    creds = c;
    client = new RelayClient({ url: base, credentials: c, onState });
    const who = c.credentials;
    el("household").textContent = `Household ${who.household}`;
    el("self").textContent = who.device;
    for (const id of ["who", "devices", "invite", "pending", "forget-bar"])
        show(id, true);
    show("pair", false);
    await refresh();
    refreshTimer = setInterval(() => void refresh(), REFRESH_MS);
}
/** Reads every page of the directory and shows it. */
async function refresh() {
    const c = client;
    if (!c || !creds)
        return;
    const self = creds.credentials.device;
    const all = [];
    try {
        let after;
        do {
            const page = await c.devices(after === undefined ? {} : { after });
            all.push(...page.devices);
            after = page.next;
        } while (after !== undefined);
    }
    catch (e) {
        if (c === client)
            say("devices-error", `The devices could not be read: ${describe(e)}`);
        return;
    }
    if (c !== client)
        return;
    say("devices-error", "");
    const rows = [];
    for (const d of all)
        rows.push(await row(d, d.device === self));
    el("device-rows").replaceChildren(...rows);
    await refreshPending(c);
}
/** Lists the household's pending invitations, each with a Cancel button. */
async function refreshPending(c) {
    let pending;
    try {
        pending = (await c.invitations()).invitations.filter((i) => i.redeemed_at === null);
    }
    catch (e) {
        if (c === client)
            say("pending-error", `The invitations could not be read: ${describe(e)}`);
        return;
    }
    if (c !== client)
        return;
    say("pending-error", "");
    const rows = pending.map((inv) => {
        const tr = node("tr");
        tr.dataset.device = inv.device;
        const name = node("td", inv.device, "name");
        if (inv.replace)
            name.append(node("span", "replaces the device", "tag"));
        const action = node("td", "", "action");
        const b = node("button", "Cancel", "remove");
        b.type = "button";
        b.addEventListener("click", () => void cancelInvitation(inv.device));
        action.append(b);
        tr.append(name, node("td", inv.scope), node("td", until(inv.expires_at)), node("td", inv.created_by), action);
        return tr;
    });
    el("pending-rows").replaceChildren(...rows);
    show("pending-none", rows.length === 0);
    // The invitation shown is done with once it is no longer pending
    // (redeemed, cancelled elsewhere, expired): its code would only mislead.
    const shown = el("inv-device").dataset.device;
    if (shown && !pending.some((i) => i.device === shown))
        show("invitation", false);
}
async function cancelInvitation(device) {
    if (!client)
        return;
    try {
        await client.cancelInvitation(device);
        say("pending-error", "");
    }
    catch (e) {
        say("pending-error", `The invitation of ${device} could not be cancelled: ${describe(e)}`);
    }
    if (el("inv-device").dataset.device === device)
        show("invitation", false);
    await refresh();
}
async function row(d, self) {
    const tr = node("tr");
    tr.dataset.device = d.device;
    const name = node("td", d.device, "name");
    if (self)
        name.append(node("span", "this browser", "tag"));
    const seen = node("td", ago(d.last_seen), "seen");
    seen.title = new Date(d.last_seen).toLocaleString();
    const push = d.push_kind === "none" ? node("td", "none", "push none") : node("td", d.push_kind, "push");
    const fp = d.identity_key ? node("td", await fingerprint(decodeBase64(d.identity_key)), "fingerprint") : node("td", "no key", "fingerprint none");
    const action = node("td", "", "action");
    if (!self) {
        const b = node("button", "Remove", "remove");
        b.type = "button";
        b.addEventListener("click", () => confirmRemove(d.device));
        action.append(b);
    }
    tr.append(name, seen, push, fp, action);
    return tr;
}
let removing = "";
function confirmRemove(device) {
    removing = device;
    el("confirm-device").textContent = device;
    el("confirm").showModal();
}
async function remove() {
    const device = removing;
    el("confirm").close();
    if (!client || !device)
        return;
    try {
        await client.removeDevice(device);
        say("devices-error", "");
    }
    catch (e) {
        say("devices-error", `${device} could not be removed: ${describe(e)}`);
    }
    await refresh();
}
async function invite(ev) {
    ev.preventDefault();
    if (!client)
        return;
    const device = el("invite-device").value.trim();
    const scope = el("invite-admin").checked ? "admin" : "device";
    const replace = el("invite-replace").checked;
    let inv;
    try {
        inv = await client.invite(device, { scope, replace });
    }
    catch (e) {
        const why = e instanceof RelayError && e.code === "device_exists"
            ? `A device named ${device} exists. To pair a new device in its place, tick "replace the device of that name": pairing then removes the old one, its envelopes and its credentials.`
            : `The invitation failed: ${describe(e)}`;
        say("invite-error", why);
        return;
    }
    say("invite-error", "");
    el("inv-device").textContent = `${inv.device}${scope === "admin" ? " (admin)" : ""}${inv.replace ? ", replacing the device of that name" : ""}`;
    el("inv-device").dataset.device = inv.device;
    el("inv-code").textContent = inv.code;
    el("inv-expires").textContent = until(inv.expires_at);
    el("inv-command").textContent = `relay pair -url ${base} -code ${inv.code} -store ${inv.device}.json`;
    el("inv-link").textContent = inv.url;
    const img = el("qr");
    if (qrURL)
        URL.revokeObjectURL(qrURL);
    qrURL = undefined;
    img.removeAttribute("src");
    show("invitation", true);
    void refresh();
    try {
        qrURL = await qrCode(inv.code, inv.scope);
        img.src = qrURL;
    }
    catch (e) {
        say("invite-error", `The QR code could not be made: ${describe(e)}`);
    }
}
/**
 * The relay draws the QR code of the invitation's link (POST /console/qr,
 * admin token, the code in the body: never in a URL), as an SVG that the
 * page shows through an object URL. The scope picks the link: an app
 * device's is its pairing page, which any camera opens and which hands
 * the code to the app, an admin's the console.
 */
async function qrCode(code, scope) {
    const c = creds;
    if (!c)
        throw new Error("not paired");
    const post = (tok) => fetch(`${base}/console/qr`, {
        method: "POST",
        headers: { Authorization: `Bearer ${tok}`, "Content-Type": "application/json" },
        body: JSON.stringify({ code, scope }),
        redirect: "error",
        cache: "no-store",
    });
    let tok = await c.token();
    let resp = await post(tok);
    if (resp.status === 401) {
        tok = await c.refused(tok);
        resp = await post(tok);
    }
    if (resp.status !== 200)
        throw new Error(`the relay answered ${resp.status}`);
    return URL.createObjectURL(await resp.blob());
}
/** A link's code pairs only once its household is confirmed; a typed one at once. */
function submitPair(ev) {
    ev.preventDefault();
    const code = el("code").value;
    if (link.code !== "" && code === link.code) {
        el("confirm-pair-household").textContent = link.household || "(the link names none)";
        el("confirm-pair").showModal();
        return;
    }
    void doPair();
}
async function doPair() {
    const button = el("pair-submit");
    button.disabled = true;
    say("pair-error", "");
    try {
        // Only an admin's code: the console cannot use another, and the relay
        // leaves it unspent for the app it was made for.
        await pair(base, el("code").value, { store, scope: "admin" });
    }
    catch (e) {
        const why = e instanceof RelayError && e.status === 401
            ? "The code is not valid here: mistyped, used, replaced, expired, or an app device's code (enter that one in the app: it is still unspent)."
            : describe(e);
        say("pair-error", why);
        return;
    }
    finally {
        button.disabled = false;
    }
    const named = link.household;
    link = noLink;
    say("notice", "");
    await open();
    const paired = creds?.credentials.household;
    if (named && paired && paired !== named) {
        say("notice", `The link named household ${named}, but its code paired this browser with household ${paired}. If that is not yours, forget this browser's credentials below.`);
    }
}
async function start() {
    el("pair-form").addEventListener("submit", (ev) => submitPair(ev));
    el("confirm-pair-ok").addEventListener("click", () => {
        el("confirm-pair").close();
        void doPair();
    });
    el("confirm-pair-cancel").addEventListener("click", () => el("confirm-pair").close());
    el("invite-form").addEventListener("submit", (ev) => void invite(ev));
    el("refresh").addEventListener("click", () => void refresh());
    el("confirm-remove").addEventListener("click", () => void remove());
    el("confirm-cancel").addEventListener("click", () => el("confirm").close());
    el("forget").addEventListener("click", () => {
        forget();
        showPair("", "This browser's credentials are forgotten. To remove it from the household too, remove it from another admin device.");
    });
    // relay invite asks http://127.0.0.1:8080 unless told; the page knows
    // its own relay, wherever it runs.
    el("pair-command").textContent = `relay invite -url ${base} -household home -device browser -scope admin`;
    link = takePairLink();
    const paired = (await store.load()) !== undefined;
    if (link.code !== "" && !link.admin) {
        showAppLink(link, paired);
        link = noLink;
        if (!paired)
            return;
    }
    const code = link.code;
    if (!paired) {
        showPair(code);
        return;
    }
    if (code)
        say("notice", "This browser is paired already; the link's code was not used. Open it on the device it was made for.");
    await open();
}
start().catch((e) => say("notice", `The console failed to start: ${describe(e)}`));
