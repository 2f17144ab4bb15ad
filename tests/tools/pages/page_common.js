// What the third-party viewer test pages share (three_splats.js, babylon_splats.js): the
// embedded GLB and the URL parameters. No viewer library here.

// The GLB, base64 in <script id="chord-glb"> (chord.stages.viewer.page), as bytes.
export function readGlb() {
  const binary = atob(document.getElementById("chord-glb").textContent.replace(/\s+/g, ""));
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes.buffer;
}

// ?t=<seconds> (default 0), ?camera=elev,azim,radius,x,y,z (required), ?fovy=<degrees>.
export function params() {
  const q = new URLSearchParams(window.location.search);
  const t = Number(q.get("t") || 0);
  if (!Number.isFinite(t) || t < 0) throw new Error(`?t=${q.get("t")}: expected seconds >= 0`);
  const camera = (q.get("camera") || "").split(",").map(Number);
  if (camera.length !== 6 || !camera.every(Number.isFinite) || !(camera[2] > 0)) {
    throw new Error(`?camera=${q.get("camera")}: expected elev,azim,radius,x,y,z`);
  }
  const fovy = Number(q.get("fovy") || 35);
  return { t, camera, fovy };
}

// chord.render.cameras' orbit: the eye at p + r·(cos e·sin a, sin e, cos e·cos a), looking at
// p with y up; near and far planes around the radius.
export function orbitPosition([elev, azim, radius, x, y, z]) {
  const e = (elev * Math.PI) / 180;
  const a = (azim * Math.PI) / 180;
  const position = [
    x + radius * Math.cos(e) * Math.sin(a),
    y + radius * Math.sin(e),
    z + radius * Math.cos(e) * Math.cos(a),
  ];
  return { position, target: [x, y, z], near: radius / 100, far: radius * 100 };
}
