// Stands in for the browser's Web Locks in Node.js (which has BroadcastChannel but not navigator.locks), for
// the scripts that drive web/tabs.js: each lock name grants its holders one after another, in order.
globalThis.self = globalThis;
const held = new Map(); // lock name -> queue of waiting grants
globalThis.navigator = {
  locks: {
    request(name, grant) {
      return new Promise((resolve) => {
        const run = () =>
          Promise.resolve(grant()).then(() => {
            const queue = held.get(name);
            queue.shift();
            if (queue.length) queue[0]();
            else held.delete(name);
            resolve();
          });
        if (!held.has(name)) held.set(name, []);
        const queue = held.get(name);
        queue.push(run);
        if (queue.length === 1) run();
      });
    },
  },
};
