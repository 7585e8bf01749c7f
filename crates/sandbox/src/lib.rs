//! `deskfs exec`: a command run against a desk inside a bubblewrap sandbox.
