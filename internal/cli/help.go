package cli

const usage = `usage: relay [command] [flags]; relay help COMMAND or relay COMMAND -h for its flags

commands:
  serve    run the relay (default); flags and FN_* variables: relay serve -h
  keygen   create an issuer key pair
  pubkey   print the public key of an issuer key file
  token    mint a device token with the issuer key;
           token check: show a token and whether the relay accepts it
  migrate  apply the store's migrations and exit
  backup   copy the SQLite database while the relay runs: relay backup FILE
  restore  put a backup in place of the SQLite database (relay stopped)
  send     send an envelope as a device: relay send -h
  listen   print a device's envelopes as JSON lines: relay listen -h
  invite   make a pairing code (and QR code) for a device: relay invite -h
  pair     redeem an invitation's code; keep the device's credentials in a
           file that send and listen take with -store: relay pair -h
  devices  list the household's devices, with the issuer key: relay devices -h
  remove   remove a device of the household: relay remove NAME
  probe    GET a URL (default http://127.0.0.1:8080/ready), exit 0 on 200:
           a health check for images without a shell
  version  print the version
  help     this list; help COMMAND: the command's flags`
