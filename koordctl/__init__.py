"""koordctl: the operator's CLI (validate, status, decisions, doctor, top, demo). Imports the daemon's packages; koordd never imports koordctl."""
