// One KTX2 image (Basis Universal ETC1S or UASTC) on stdin -> its base level as RGBA8 on
// stdout, after an 8-byte header (width, height: uint32 little-endian). Errors go to stderr
// with exit status 1. The transcoder is Basis Universal's, as three.js ships it.
import { readFileSync } from "node:fs";
import wasmBinary from "three/examples/jsm/libs/basis/basis_transcoder.wasm";
// An Emscripten script (a global BASIS, CommonJS at its end) in an ES-module package: taken as
// text and evaluated with what it asks of Node, as three's KTX2Loader runs it in a worker.
import source from "three/examples/jsm/libs/basis/basis_transcoder.js" with { type: "text" };

const BASIS = new Function("require", "__dirname", "__filename", `${source}\nreturn BASIS;`)(
  require,
  __dirname,
  __filename,
);

const RGBA32 = 13; // basist::transcoder_texture_format::cTFRGBA32

function fail(message) {
  process.stderr.write(`ktx2: ${message}\n`);
  process.exit(1);
}

const data = new Uint8Array(readFileSync(0));
BASIS({ wasmBinary }).then((basis) => {
  basis.initializeBasis();
  const file = new basis.KTX2File(data);
  try {
    if (!file.isValid()) fail("not a valid KTX2 file");
    if (!file.isETC1S() && !file.isUASTC()) fail("not Basis Universal data (ETC1S or UASTC)");
    if (file.getFaces() > 1) fail("a cube map, not a 2D texture");
    const width = file.getWidth();
    const height = file.getHeight();
    if (!file.startTranscoding()) fail("the transcoder cannot start on this file");
    const out = new Uint8Array(file.getImageTranscodedSizeInBytes(0, 0, 0, RGBA32));
    if (!file.transcodeImage(out, 0, 0, 0, RGBA32, 0, -1, -1)) fail("transcoding failed");
    const head = Buffer.alloc(8);
    head.writeUInt32LE(width, 0);
    head.writeUInt32LE(height, 4);
    process.stdout.write(Buffer.concat([head, Buffer.from(out.buffer, out.byteOffset, out.length)]));
  } finally {
    file.close();
    file.delete();
  }
});
