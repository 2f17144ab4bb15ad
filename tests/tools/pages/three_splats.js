// A test page (tests/stages/test_splat_viewers.py): the GLB embedded in the page drawn by
// three.js's own KHR_gaussian_splatting loader, GLTFGaussianSplatLoaderExtension (three
// 0.187), as a user of three.js would load it: GLTFLoader with the plugin registered,
// GaussianSplat objects on WebGPURenderer (the class requires it; forceWebGL: its WebGL 2
// backend, which headless Chromium's SwiftShader has) and the file's animations on an
// AnimationMixer. Nothing of ours draws or poses a splat.
//
// The page (chord.stages.viewer.page) holds the GLB as base64 in <script id="chord-glb">.
// URL parameters:
//   ?t=<seconds>  the animation time shown (the clips played once and held at the end);
//   ?camera=<elev>,<azim>,<radius>,<x>,<y>,<z>  an orbit camera as chord.render.cameras
//                 places one (degrees; looking at x, y, z with y up); ?fovy=<degrees>.
// When a frame is drawn it logs "splat-viewer: ready viewer=three splats=<n> ...", and
// "splat-viewer: <message>" as an error on failure.

import { AnimationMixer, Color, LoopOnce, PerspectiveCamera, Scene, WebGPURenderer } from "three/webgpu";
import { GLTFGaussianSplatLoaderExtension } from "three/addons/loaders/GLTFGaussianSplatLoaderExtension.js";
import { GLTFLoader } from "three/addons/loaders/GLTFLoader.js";
import { orbitPosition, params, readGlb } from "./page_common.js";

const BACKGROUND = 0xd4d8de;

async function main() {
  const { t, camera: orbit, fovy } = params();
  const loader = new GLTFLoader();
  loader.register((parser) => new GLTFGaussianSplatLoaderExtension(parser));
  const gltf = await loader.parseAsync(readGlb(), "");

  const renderer = new WebGPURenderer({ forceWebGL: true, antialias: false });
  renderer.setPixelRatio(window.devicePixelRatio);
  renderer.setSize(window.innerWidth, window.innerHeight);
  document.body.appendChild(renderer.domElement);
  await renderer.init();
  const scene = new Scene();
  scene.background = new Color(BACKGROUND);
  scene.add(gltf.scene);
  const camera = new PerspectiveCamera(fovy, window.innerWidth / window.innerHeight, 0.01, 100);
  const { position, target, near, far } = orbitPosition(orbit);
  camera.position.set(...position);
  camera.up.set(0, 1, 0);
  camera.lookAt(...target);
  camera.near = near;
  camera.far = far;
  camera.updateProjectionMatrix();

  const mixer = new AnimationMixer(gltf.scene);
  for (const clip of gltf.animations) {
    const action = mixer.clipAction(clip);
    action.setLoop(LoopOnce, 1);
    action.clampWhenFinished = true;
    action.play();
  }
  mixer.setTime(t);
  gltf.scene.updateMatrixWorld(true);

  let splats = 0;
  let objects = 0;
  gltf.scene.traverse((o) => {
    if (o.isGaussianSplat) {
      objects += 1;
      splats += o.splatGeometry.getAttribute("position").count;
    }
  });
  window.addEventListener("resize", () => {
    camera.aspect = window.innerWidth / window.innerHeight;
    camera.updateProjectionMatrix();
    renderer.setSize(window.innerWidth, window.innerHeight);
  });
  renderer.setAnimationLoop(() => renderer.render(scene, camera));
  renderer.render(scene, camera);
  const duration = Math.max(0, ...gltf.animations.map((clip) => clip.duration));
  console.info(
    `splat-viewer: ready viewer=three splats=${splats} objects=${objects} ` +
      `clips=${gltf.animations.length} duration=${duration} t=${mixer.time} ` +
      `backend=${renderer.backend.isWebGLBackend ? "webgl2" : "webgpu"}`,
  );
}

main().catch((error) => console.error(`splat-viewer: ${error && error.stack ? error.stack : error}`));
