"""glTF in and out: the container, a user's file checked and made plain (decoders, textures,
KTX2, URIs), and the animated scenes we write."""
