// A windowed list: only the rows in view (and a few around them) exist in the page, each placed at its index
// times a fixed row height, so a list of 50,000 records costs about what one screenful does. A live change
// re-draws only the rows in view whose record changed: records are replaced, never changed in place, so a
// row is updated only when its record is a new object. The page says what a row holds (createRow, updateRow).

export class ListWindow {
  /**
   * @param {object} options
   * @param {HTMLElement} options.list the rows' parent (positioned; its height becomes the whole list's)
   * @param {HTMLElement} options.viewport the scrolling element around it
   * @param {number} options.rowHeight px, the rows' height in the style sheet
   * @param {number} [options.overscan] rows drawn above and below the visible ones
   * @param {(id: string) => {item: HTMLElement}} options.createRow a new row (its element as `item`) for a record id
   * @param {(row: object, record: object) => void} options.updateRow shows a record (new or changed) in its row
   * @param {() => void} [options.afterDraw] called after each draw
   */
  constructor({ list, viewport, rowHeight, overscan = 8, createRow, updateRow, afterDraw = () => {} }) {
    Object.assign(this, { list, viewport, rowHeight, overscan, createRow, updateRow, afterDraw });
    this.records = []; // the whole list, in order
    this.drawn = new Map(); // record id -> {row, shown: the record it shows, top: its index}, for the rows drawn
    this.scheduled = false;
  }

  /** Show ``records`` (the whole list, in order) from the next frame on. */
  show(records) {
    this.records = records;
    this.drawSoon();
  }

  /** Many changes can arrive between two frames (a sync batch, a burst of writes, scrolling): draw once per frame. */
  drawSoon() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      this.draw();
    });
  }

  draw() {
    const { list, viewport, rowHeight, overscan, records, drawn } = this;
    list.style.height = `${records.length * rowHeight}px`;
    const first = Math.max(0, Math.floor(viewport.scrollTop / rowHeight) - overscan);
    const last = Math.min(records.length, Math.ceil((viewport.scrollTop + viewport.clientHeight) / rowHeight) + overscan);
    const alive = new Set();
    let cursor = list.firstElementChild;
    for (let index = first; index < last; index++) {
      const record = records[index];
      alive.add(record.id);
      let entry = drawn.get(record.id);
      if (!entry) drawn.set(record.id, (entry = { row: this.createRow(record.id), shown: null, top: -1 }));
      if (entry.shown !== record) {
        entry.shown = record;
        this.updateRow(entry.row, record);
      }
      if (entry.top !== index) {
        entry.top = index;
        entry.row.item.style.top = `${index * rowHeight}px`;
      }
      // Rows stay in list order in the document too (for assistive technology and the tests).
      if (entry.row.item === cursor) cursor = cursor.nextElementSibling;
      else list.insertBefore(entry.row.item, cursor);
    }
    for (const [id, entry] of drawn) {
      if (!alive.has(id)) {
        entry.row.item.remove();
        drawn.delete(id);
      }
    }
    this.afterDraw();
  }
}
