// The scene viewer pages (chord.stages.viewer writes them): play the scene's animated GLB,
// embedded in the page as base64, with three.js. Nothing is fetched at view time.
//
// The page holds two data elements before this script:
//   <script id="chord-glb" type="application/octet-stream" data-view="mesh|splats">  base64
//   <script id="chord-config" type="application/json">        {"title": ...}
// data-view "mesh" draws the GLB's meshes (dynamic_scene_skinned.glb); "splats" draws the
// KHR_gaussian_splatting primitives of dynamic_splats.glb as Gaussian splats (splats.js).
// URL parameters (tests, comparing frames):
//   ?t=<seconds>  pause at that animation time; the clip then plays once and clamps, so
//                 t >= duration shows the last frame instead of frame 0.
//   ?camera=<elev>,<azim>,<radius>,<x>,<y>,<z>  a fixed orbit camera as chord.cameras places
//                 it (degrees; looking at x, y, z with y up) instead of framing the motion;
//   ?fovy=<degrees>  the vertical field of view (default FOV).
// When the frame is drawn the page logs "chord-viewer: ready ..." and sets
// document.body.dataset.state to "ready" ("error" and a message on failure).

import {
  AnimationMixer,
  Box3,
  Color,
  DirectionalLight,
  HemisphereLight,
  LoopOnce,
  LoopRepeat,
  NeutralToneMapping,
  PerspectiveCamera,
  PMREMGenerator,
  Scene,
  Timer,
  Vector2,
  Vector3,
  WebGLRenderer,
} from "three";
import { OrbitControls } from "three/addons/controls/OrbitControls.js";
import { RoomEnvironment } from "three/addons/environments/RoomEnvironment.js";
import { GLTFLoader } from "three/addons/loaders/GLTFLoader.js";
import { loadSplats, splatMesh } from "./splats.js";

const BACKGROUND = 0xd4d8de; // as the page's, so a light table stands out
const ENVIRONMENT = 0.8; // the room's light
const FOV = 35; // vertical field of view, degrees
const VIEW_DIR = new Vector3(0.0, 0.45, 1.0).normalize(); // from the front (+z), a little above
const MARGIN = 1.15; // the scene's box fills at most 1 / MARGIN of the view's width or height
const MAX_BOUND_SAMPLES = 64; // animation times sampled for the scene's bounds

function decodeBase64(text) {
  const binary = atob(text.replace(/\s+/g, ""));
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes.buffer;
}

function parseGlb(buffer) {
  return new Promise((resolve, reject) => new GLTFLoader().parse(buffer, "", resolve, reject));
}

function requestedTime() {
  const raw = new URLSearchParams(window.location.search).get("t");
  if (raw === null) return null;
  const t = Number(raw);
  if (!Number.isFinite(t) || t < 0) {
    throw new Error(`?t=${raw}: expected a time in seconds >= 0`);
  }
  return t;
}

// ?camera= and ?fovy= (see the top): {fovy, orbit: null | [elev, azim, radius, x, y, z]}.
function requestedCamera() {
  const params = new URLSearchParams(window.location.search);
  const fovy = params.get("fovy") === null ? FOV : Number(params.get("fovy"));
  if (!(fovy > 0 && fovy < 180)) {
    throw new Error(`?fovy=${params.get("fovy")}: expected degrees in (0, 180)`);
  }
  const raw = params.get("camera");
  if (raw === null) return { fovy, orbit: null };
  const orbit = raw.split(",").map(Number);
  if (orbit.length !== 6 || !orbit.every(Number.isFinite) || !(orbit[2] > 0)) {
    throw new Error(`?camera=${raw}: expected elev,azim,radius,x,y,z (degrees, radius > 0)`);
  }
  return { fovy, orbit };
}

// chord.cameras.orbit_position: p + r·(cos e·sin a, sin e, cos e·cos a), looking at p, y up.
function placeOrbit(camera, controls, [elev, azim, radius, x, y, z]) {
  const e = (elev * Math.PI) / 180;
  const a = (azim * Math.PI) / 180;
  const target = new Vector3(x, y, z);
  const offset = new Vector3(Math.cos(e) * Math.sin(a), Math.sin(e), Math.cos(e) * Math.cos(a));
  camera.position.copy(target).addScaledVector(offset, radius);
  camera.up.set(0, 1, 0);
  camera.lookAt(target);
  camera.near = radius / 100;
  camera.far = radius * 100;
  camera.updateProjectionMatrix();
  controls.target.copy(target);
  controls.update();
}

// The times the bounds are sampled at: every key of every track (the extremes of STEP and
// LINEAR motion), at most MAX_BOUND_SAMPLES of them, evenly spread.
function boundTimes(clips, duration) {
  const keys = new Set([0, duration]);
  for (const clip of clips) {
    for (const track of clip.tracks) for (const t of track.times) keys.add(t);
  }
  const times = [...keys].filter((t) => t <= duration).sort((a, b) => a - b);
  if (times.length <= MAX_BOUND_SAMPLES) return times;
  const step = (times.length - 1) / (MAX_BOUND_SAMPLES - 1);
  return Array.from({ length: MAX_BOUND_SAMPLES }, (_, i) => times[Math.round(i * step)]);
}

// The box holding every vertex (morph targets and skins applied) at those times, so the camera
// frames the whole motion, not only frame 0.
function animatedBounds(root, seek, times) {
  const box = new Box3();
  for (const t of times) {
    seek(t);
    root.updateMatrixWorld(true);
    box.union(new Box3().setFromObject(root, true));
  }
  return box;
}

// Place the camera on VIEW_DIR from the box's centre, at the least distance at which every
// corner of the box lies inside both fields of view (with MARGIN to spare).
function frame(camera, controls, box) {
  const centre = box.getCenter(new Vector3());
  camera.position.copy(centre).add(VIEW_DIR);
  camera.lookAt(centre);
  camera.updateMatrixWorld();
  const right = new Vector3().setFromMatrixColumn(camera.matrixWorld, 0);
  const up = new Vector3().setFromMatrixColumn(camera.matrixWorld, 1);
  const tanV = Math.tan((camera.fov * Math.PI) / 360) / MARGIN;
  const tanH = tanV * camera.aspect;
  let distance = 1e-6;
  for (let i = 0; i < 8; i++) {
    const corner = new Vector3(
      i & 1 ? box.max.x : box.min.x,
      i & 2 ? box.max.y : box.min.y,
      i & 4 ? box.max.z : box.min.z,
    ).sub(centre);
    const toward = corner.dot(VIEW_DIR); // nearer the camera by this much
    distance = Math.max(
      distance,
      toward + Math.abs(corner.dot(right)) / tanH,
      toward + Math.abs(corner.dot(up)) / tanV,
    );
  }
  camera.position.copy(centre).addScaledVector(VIEW_DIR, distance);
  camera.near = distance / 100;
  camera.far = distance * 100;
  camera.updateProjectionMatrix();
  controls.target.copy(centre);
  controls.update();
}

function fail(error) {
  document.body.dataset.state = "error";
  const message = document.createElement("pre");
  message.textContent = `chord-viewer: ${error && error.message ? error.message : error}`;
  document.body.appendChild(message);
  console.error(message.textContent);
}

// The mesh view: the GLB's scene lit by a neutral room and a key light.
function meshView(renderer, scene, gltf) {
  renderer.toneMapping = NeutralToneMapping; // keeps base colours, rolls off highlights
  // A neutral room to reflect (glTF's default material is fully metallic) plus a key light
  // for shape; the demo meshes have no normals, so three.js shades them flat. A 64-pixel
  // cube map (default 256) lights rough materials the same and builds faster in software.
  const pmrem = new PMREMGenerator(renderer);
  scene.environment = pmrem.fromScene(new RoomEnvironment(), 0.04, 0.1, 100, { size: 64 }).texture;
  scene.environmentIntensity = ENVIRONMENT;
  scene.add(new HemisphereLight(0xffffff, 0x606060, 0.3));
  const sun = new DirectionalLight(0xffffff, 1.0);
  sun.position.set(1.0, 2.0, 1.5);
  scene.add(sun);
  scene.add(gltf.scene);
  return {
    bounds: (seek, times) => animatedBounds(gltf.scene, seek, times),
    beforeRender: () => {},
  };
}

// The splat view: the splat primitives, posed at the mixer's time before each frame. Colours
// are drawn as stored (display sRGB, no tone mapping), as chord's rasterizer draws them.
async function splatView(renderer, scene, gltf, camera) {
  const splats = splatMesh(await loadSplats(gltf));
  scene.add(splats.mesh);
  const pose = () => gltf.scene.updateMatrixWorld(true); // the joints' world matrices
  return {
    bounds: (seek, times) => {
      const box = new Box3();
      for (const t of times) {
        seek(t);
        pose();
        box.union(splats.bounds());
      }
      return box;
    },
    beforeRender: () => {
      pose();
      splats.update(camera, renderer);
    },
    count: splats.count,
  };
}

async function main() {
  const config = JSON.parse(document.getElementById("chord-config").textContent);
  const pause = requestedTime();
  const fixed = requestedCamera();
  const data = document.getElementById("chord-glb");
  const kind = data.dataset.view || "mesh";
  if (kind !== "mesh" && kind !== "splats") throw new Error(`data-view=${kind}: not mesh|splats`);
  const gltf = await parseGlb(decodeBase64(data.textContent));

  // No multisampling for splats: each pixel is shaded at its centre, as chord's rasterizer.
  const renderer = new WebGLRenderer({ antialias: kind === "mesh" });
  renderer.setPixelRatio(window.devicePixelRatio);
  renderer.setSize(window.innerWidth, window.innerHeight);
  document.body.appendChild(renderer.domElement);
  const scene = new Scene();
  scene.background = new Color(BACKGROUND);
  const camera = new PerspectiveCamera(
    fixed.fovy,
    window.innerWidth / window.innerHeight,
    0.01,
    100,
  );
  const controls = new OrbitControls(camera, renderer.domElement);
  const view =
    kind === "mesh"
      ? meshView(renderer, scene, gltf)
      : await splatView(renderer, scene, gltf, camera);

  const mixer = new AnimationMixer(gltf.scene);
  const duration = Math.max(0, ...gltf.animations.map((clip) => clip.duration));
  const actions = gltf.animations.map((clip) => mixer.clipAction(clip).play());
  // Show time t from the start, looping or (paused, and for the bounds) played once and held
  // at the end, so t >= duration is the last frame; a finished action is paused: reset first.
  const seek = (t, loop) => {
    for (const action of actions) {
      action.reset();
      action.setLoop(loop ? LoopRepeat : LoopOnce, Infinity);
      action.clampWhenFinished = !loop;
    }
    mixer.setTime(t);
  };

  let bounds = null;
  const place = () => {
    if (fixed.orbit) {
      placeOrbit(camera, controls, fixed.orbit);
      return;
    }
    if (bounds === null) {
      bounds = view.bounds((t) => seek(t, false), boundTimes(gltf.animations, duration));
    }
    frame(camera, controls, bounds);
  };
  place();
  seek(pause === null ? 0 : pause, pause === null);

  const render = () => {
    view.beforeRender();
    renderer.render(scene, camera);
  };
  let orbited = false; // a resize re-frames the scene until the user moves the camera
  controls.addEventListener("start", () => {
    orbited = true;
  });
  window.addEventListener("resize", () => {
    camera.aspect = window.innerWidth / window.innerHeight;
    if (!orbited) place();
    camera.updateProjectionMatrix();
    renderer.setSize(window.innerWidth, window.innerHeight);
    render();
  });
  if (pause === null) {
    const timer = new Timer();
    timer.connect(document); // no jump in time after the page was hidden
    renderer.setAnimationLoop((timestamp) => {
      timer.update(timestamp);
      mixer.update(timer.getDelta());
      controls.update();
      render();
    });
  } else {
    controls.addEventListener("change", render); // paused: draw only when the view moves
    render();
  }
  document.body.dataset.state = "ready";
  const at = camera.position.toArray().map((v) => v.toFixed(3));
  const size = renderer.getDrawingBufferSize(new Vector2()).toArray();
  console.info(
    `chord-viewer: ready title=${JSON.stringify(config.title)} view=${kind} ` +
      `t=${pause === null ? "loop" : mixer.time} duration=${duration} ` +
      `clips=${gltf.animations.length} camera=${at} size=${size.join("x")}` +
      (view.count === undefined ? "" : ` splats=${view.count}`),
  );
}

main().catch(fail);
