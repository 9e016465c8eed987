"""Reading and writing bytes that come from outside safely: atomic files, strict JSON Lines, typed checks of outside values, secrets kept out."""
