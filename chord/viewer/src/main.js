// The scene viewer page (chord.stages.viewer writes it): plays the scene's animated GLB,
// embedded in the page as base64, with three.js. Nothing is fetched at view time.
//
// The page holds two data elements before this script:
//   <script id="chord-glb" type="application/octet-stream">  the GLB, base64
//   <script id="chord-config" type="application/json">        {"title": ...}
// URL parameter ?t=<seconds>: pause at that animation time (tests, comparing frames); the
// clip then plays once and clamps, so t >= duration shows the last frame instead of frame 0.
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
  Vector3,
  WebGLRenderer,
} from "three";
import { OrbitControls } from "three/addons/controls/OrbitControls.js";
import { RoomEnvironment } from "three/addons/environments/RoomEnvironment.js";
import { GLTFLoader } from "three/addons/loaders/GLTFLoader.js";

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

async function main() {
  const config = JSON.parse(document.getElementById("chord-config").textContent);
  const pause = requestedTime();
  const gltf = await parseGlb(decodeBase64(document.getElementById("chord-glb").textContent));

  const renderer = new WebGLRenderer({ antialias: true });
  renderer.setPixelRatio(window.devicePixelRatio);
  renderer.toneMapping = NeutralToneMapping; // keeps base colours, rolls off highlights
  renderer.setSize(window.innerWidth, window.innerHeight);
  document.body.appendChild(renderer.domElement);

  const scene = new Scene();
  scene.background = new Color(BACKGROUND);
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

  const camera = new PerspectiveCamera(FOV, window.innerWidth / window.innerHeight, 0.01, 100);
  const controls = new OrbitControls(camera, renderer.domElement);
  const times = boundTimes(gltf.animations, duration);
  const bounds = animatedBounds(gltf.scene, (t) => seek(t, false), times);
  frame(camera, controls, bounds);
  seek(pause === null ? 0 : pause, pause === null);

  const render = () => renderer.render(scene, camera);
  let orbited = false; // a resize re-frames the scene until the user moves the camera
  controls.addEventListener("start", () => {
    orbited = true;
  });
  window.addEventListener("resize", () => {
    camera.aspect = window.innerWidth / window.innerHeight;
    if (!orbited) frame(camera, controls, bounds);
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
  console.info(
    `chord-viewer: ready title=${JSON.stringify(config.title)} ` +
      `t=${pause === null ? "loop" : mixer.time} duration=${duration} ` +
      `clips=${gltf.animations.length} camera=${at}`,
  );
}

main().catch(fail);
