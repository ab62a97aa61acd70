// The sealed-envelope example of the README and of docs/E2E.md:
// readme.test.ts checks that both show exactly the lines between the
// markers (with the package's name for ../index.js) and runs them against
// a relay.
import { Identity, Keyring, MemoryPinStore, RelayClient, SealedClient, newId } from "../index.js";

export async function sealedExample(url: string, phoneToken: string, laptopToken: string): Promise<string> {
  // README:begin
  // Each device: its identity (persist identity.seed), its pins, registered.
  const phone = await SealedClient.register(
    new RelayClient({ url, token: phoneToken }),
    await Identity.generate(),
    await Keyring.load(new MemoryPinStore(), { onChange: (c) => console.warn(`${c.device}'s key changed`) }),
  );
  const laptop = await SealedClient.register(new RelayClient({ url, token: laptopToken }), await Identity.generate(), await Keyring.load(new MemoryPinStore()));

  await laptop.sendSealed(newId(), ["phone"], "only phone can read this");

  let got = "";
  const stop = new AbortController();
  await phone.listen(
    (e) => {
      got = new TextDecoder().decode(e.plaintext); // e.from is laptop, checked by its key
      stop.abort();
    },
    { signal: stop.signal, onRefused: (e, err) => console.warn(`seq ${e.seq} refused: ${err.code}`) },
  );
  // README:end
  return got;
}
